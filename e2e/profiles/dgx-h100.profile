# dgx-h100: an NVIDIA DGX H100. Eight H100 SXM5 GPUs, four on each CPU
# socket, every GPU with 18 NVLinks into the four NVSwitch chips (5+4+4+5),
# so every pair talks over NVLink at full bandwidth.
#
# Profile format (the full description is in README.md next to this file).
# One statement a line; # starts a comment; values with blanks go in quotes.
#   driver <version>            what nvmlSystemGetDriverVersion answers
#   nvml <version>              what nvmlSystemGetNVMLVersion answers
#   cuda <int>                  nvmlSystemGetCudaDriverVersion (12040 is 12.4)
#   nvswitch <name> <bus id>    an NVSwitch that GPU links can lead to
#   defaults key=value...       keys for the gpu lines below (merged, later wins)
#   gpu <index> key=value...    one GPU, listed in index order from 0
#   mig <gpu> key=value...      one MIG device of a gpu with mig=on (README.md)
#   pcie <level> same-numa      pairs on one NUMA node share at least <level>
#   pcie <level> <GPUs>         pairs inside the list ("0 1", "0-3", "4,6")
# gpu keys: uuid bus minor (required), name memory (MiB) numa temp slowdown
# shutdown maxtemp (Celsius) throttle (hex) arch cc brand pciid (hex) and
# nvlink=<end>*<count>,... where <end> is an nvswitch or gpuN (none: no NVLink).
# A key left out reads as NOT_SUPPORTED. PCIe levels, nearest first: internal
# single multiple hostbridge node system; a pair no rule matches is system.

driver 550.54.15
nvml   12.550.54.15
cuda   12040

nvswitch nvs0 0000:05:00.0
nvswitch nvs1 0000:06:00.0
nvswitch nvs2 0000:07:00.0
nvswitch nvs3 0000:08:00.0

defaults name="NVIDIA H100 80GB HBM3" memory=81559 arch=hopper cc=9.0 brand=nvidia pciid=0x233010de
defaults temp=33 slowdown=90 shutdown=92 maxtemp=87
defaults nvlink=nvs0*5,nvs1*4,nvs2*4,nvs3*5

gpu 0 uuid=GPU-a4c123b1-612d-d272-d137-1c17149d4395 bus=0000:18:00.0 minor=0 numa=0
gpu 1 uuid=GPU-36b3216f-daee-b975-729f-ae923d5a4fd1 bus=0000:2a:00.0 minor=1 numa=0
gpu 2 uuid=GPU-2aabfe22-8f21-9e9c-b0eb-53f16947ccf2 bus=0000:3a:00.0 minor=2 numa=0
gpu 3 uuid=GPU-5ec84d8d-bc74-2547-70f5-8904dba41ecc bus=0000:5d:00.0 minor=3 numa=0
gpu 4 uuid=GPU-cc3fc162-6e53-a130-43b0-26c48bbf33fe bus=0000:9a:00.0 minor=4 numa=1
gpu 5 uuid=GPU-ff9243a8-f506-b409-28b5-b7a767c76fb0 bus=0000:ab:00.0 minor=5 numa=1
gpu 6 uuid=GPU-08f86beb-b273-7f6a-6f0f-b23c6f5da2ce bus=0000:ba:00.0 minor=6 numa=1
gpu 7 uuid=GPU-c255404e-4fb4-4003-4d66-08697a8d41be bus=0000:db:00.0 minor=7 numa=1

# Each GPU sits behind its own PCIe switch off its own root port.
pcie node same-numa
