# dgx-a100-mig: four A100 SXM4 on one NUMA node, GPU 1 in MIG mode with no
# GPU instances created (no mig lines): NVML lists no MIG devices on it, so
# it has nothing to serve, whole or in parts. GPUs 0, 2 and 3 have MIG off;
# no NVLink is modelled. dgx-h100-mig.profile has MIG devices.
# The format is described in README.md and at the top of dgx-h100.profile.

driver 550.54.15
nvml   12.550.54.15
cuda   12040

defaults name="NVIDIA A100-SXM4-80GB" memory=81920 arch=ampere cc=8.0 brand=nvidia pciid=0x20b210de
defaults temp=32 slowdown=90 shutdown=92 maxtemp=85 nvlink=none mig=off

gpu 0 uuid=GPU-1a2b3c4d-0001-4e5f-8a9b-0c1d2e3f4a5b bus=0000:07:00.0 minor=0 numa=0
gpu 1 uuid=GPU-1a2b3c4d-0002-4e5f-8a9b-0c1d2e3f4a5b bus=0000:0f:00.0 minor=1 numa=0 mig=on
gpu 2 uuid=GPU-1a2b3c4d-0003-4e5f-8a9b-0c1d2e3f4a5b bus=0000:47:00.0 minor=2 numa=0
gpu 3 uuid=GPU-1a2b3c4d-0004-4e5f-8a9b-0c1d2e3f4a5b bus=0000:4e:00.0 minor=3 numa=0

pcie node same-numa
pcie multiple 0 1
pcie multiple 2 3
