"""`bench scaling`'s summary over repeated rounds: figures are medians, and a ratio to 1 rank
is the median of each round's own ratio (both sides of it measured one after the other),
not a ratio of medians taken from different moments of a shared host."""
from embcache.bench.scaling import summarize


def run(job, ranks, samples_per_s, cpu, norm=None):
    return {"job": job, "ranks": ranks, "samples_per_s": samples_per_s, "cpu_seconds_per_sample": cpu,
            **({"batch_norm": norm} if norm else {})}


def test_a_ratio_is_the_median_of_each_rounds_ratio():
    rounds = [[run("dlrm", 1, 100, 1.0), run("dlrm", 2, 150, 1.2), run("face", 1, 10, 5.0),
               run("face", 2, 14, 6.0, "local")],
              [run("dlrm", 1, 50, 2.0), run("dlrm", 2, 90, 2.2), run("face", 1, 10, 5.0),
               run("face", 2, 12, 7.0, "local")],  # a loaded round: both dlrm runs slow
              [run("dlrm", 1, 100, 1.0), run("dlrm", 2, 120, 1.5), run("face", 1, 10, 5.0),
               run("face", 2, 16, 5.5, "local")]]
    out = {(r["job"], r["ranks"]): r for r in summarize(rounds)}
    dlrm2 = out["dlrm", 2]
    assert dlrm2["samples_per_s"] == 120 and dlrm2["samples_per_s_runs"] == [150, 90, 120]
    assert dlrm2["speedup_vs_1_rank_runs"] == [1.5, 1.8, 1.2]
    assert dlrm2["speedup_vs_1_rank"] == 1.5  # the ratio of the medians would be 1.2
    assert abs(dlrm2["cpu_per_sample_vs_1_rank"] - 1.2) < 1e-12  # rounds' 1.2, 1.1, 1.5
    assert out["face", 2]["batch_norm"] == "local" and out["face", 2]["speedup_vs_1_rank"] == 1.4
    assert out["dlrm", 1]["speedup_vs_1_rank"] == 1.0


def test_one_round_gives_that_rounds_figures():
    out = summarize([[run("dlrm", 1, 80, 1.0), run("dlrm", 2, 100, 1.6)]])
    assert [r["speedup_vs_1_rank"] for r in out] == [1.0, 1.25]
    assert out[1]["cpu_per_sample_vs_1_rank"] == 1.6


def test_independent_processes_are_compared_with_the_one_rank_run_not_taken_for_it():
    def alone(ranks, samples_per_s, cpu):
        return {**run("dlrm", ranks, samples_per_s, cpu), "variant": "independent"}

    rounds = [[run("dlrm", 1, 100, 1.0), run("dlrm", 2, 130, 1.4), alone(2, 160, 1.2)],
              [run("dlrm", 1, 80, 1.0), run("dlrm", 2, 100, 1.5), alone(2, 120, 1.3)]]
    out = summarize(rounds)
    assert [(r["ranks"], r.get("variant")) for r in out] == [(1, None), (2, None), (2, "independent")]
    ceiling = out[2]
    assert ceiling["speedup_vs_1_rank_runs"] == [1.6, 1.5]
    assert abs(ceiling["cpu_per_sample_vs_1_rank"] - 1.25) < 1e-12  # rounds' 1.2 and 1.3
    assert out[1]["speedup_vs_1_rank_runs"] == [1.3, 1.25]
