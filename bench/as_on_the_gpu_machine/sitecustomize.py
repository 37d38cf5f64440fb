"""Put this folder on PYTHONPATH to run as on the lent GPU machine, which has neither
torchrec nor faiss: `SMALL=1 PYTHONPATH=bench/as_on_the_gpu_machine bash bench/device_check.sh`
tries the device check's steps on the CPU with the imports that machine will see."""
import sys

sys.modules["torchrec"] = None  # an import of either now raises ImportError, as it does there
sys.modules["faiss"] = None
