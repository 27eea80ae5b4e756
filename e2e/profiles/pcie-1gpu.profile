# pcie-1gpu: a one-socket workstation-class server with a single L40S, the
# node where one failed NVML read is "every GPU failing".
# The format is described in README.md and at the top of dgx-h100.profile.

driver 550.54.15
nvml   12.550.54.15
cuda   12040

gpu 0 uuid=GPU-9b1e6c20-4d8f-3a7b-c2e5-0f1a2b3c4d5e bus=0000:17:00.0 minor=0 numa=0 name="NVIDIA L40S" memory=46068 arch=ada cc=8.9 brand=nvidia pciid=0x26b910de temp=30 slowdown=95 shutdown=98 maxtemp=88 nvlink=none
