"""Unit factors (named, so a formula says which): every module converts with these.

Datasheets give GFLOP/s and GB/s (decimal), memory in GB, L2 in MB (binary: NVIDIA's "40 MB"
L2 of the A100 is 40 MiB) and clocks in MHz; predictions are in ms.
"""
MS_PER_S = 1e3        # ms in a second: a time in s times this is in ms
S_PER_MS = 1e-3       # s in a ms
MS_PER_US = 1e-3      # ms in a us
GIGA = 1e9            # GFLOP/s -> FLOP/s, GB/s -> B/s
MEGA = 1e6            # MHz -> Hz
KILO = 1e3            # GFLOP/s -> TFLOP/s, MHz -> clocks per ms
GHZ_PER_MHZ = 1e-3    # MHz -> GHz (clocks per ns)
KIB = 1024            # bytes in a KiB; also MiB in a GiB
MIB = 2**20           # bytes in a MiB (a datasheet's L2 MB)
GIB = 2**30           # bytes in a GiB (memory reports)
