# vgpu-1gpu: a virtual machine with one vGPU (an A100 slice through NVIDIA
# vGPU). The guest driver answers NOT_SUPPORTED to temperature, clock-event
# reasons, the recovery-action field and remapped rows: the host owns them.
# Its PCI config space names the host's vGPU manager (vgpuhost), 550.54.16
# on branch r550_00, one patch ahead of the guest's driver.
# The format is described in README.md and at the top of dgx-h100.profile.

driver 550.54.15
nvml   12.550.54.15
cuda   12040

gpu 0 uuid=GPU-3f2d9a51-7c1e-4b6a-9d0e-5a8b1c2d3e4f bus=0000:02:00.0 minor=0 numa=0 name="GRID A100D-40C" memory=40960 arch=ampere cc=8.0 brand=nvidia pciid=0x20b510de nvlink=none unsupported=temp,throttle,recovery,remap,drain vgpuhost=550.54.16:r550_00
