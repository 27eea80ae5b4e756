# pcie-4gpu: a two-socket PCIe server with four L40S and no NVLink. GPUs 0-1
# share a PCIe switch on socket 0, GPUs 2-3 another on socket 1.
# The format is described in README.md and at the top of dgx-h100.profile.

driver 550.54.15
nvml   12.550.54.15
cuda   12040

defaults name="NVIDIA L40S" memory=46068 arch=ada cc=8.9 brand=nvidia pciid=0x26b910de
defaults temp=30 slowdown=95 shutdown=98 maxtemp=88 nvlink=none

gpu 0 uuid=GPU-d440e504-54f3-1af3-1768-13e02ea68ef7 bus=0000:4f:00.0 minor=0 numa=0
gpu 1 uuid=GPU-86e4d3ce-a27d-2693-4b48-4e73cf575dca bus=0000:52:00.0 minor=1 numa=0
gpu 2 uuid=GPU-d6ba2b0a-ee0c-a923-7328-81584d8c4fa2 bus=0000:ce:00.0 minor=2 numa=1
gpu 3 uuid=GPU-815d2802-8272-83e0-ad84-173581569969 bus=0000:d1:00.0 minor=3 numa=1

pcie node same-numa
pcie single 0 1
pcie single 2 3
