"""The named choices of the modules here, so that the command line can offer them (and its
`--help` show them) without importing torch: face backbones, heads and margins."""

BACKBONES = ("mlp", "cnn", "iresnet18", "iresnet50")
HEADS = ("dcp", "fc", "pfc")
MARGINS = ("arcface", "cosface")
