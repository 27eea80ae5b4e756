# dgx1-v100: an NVIDIA DGX-1 with eight V100 SXM2 in the hybrid cube-mesh:
# six NVLinks per GPU, straight to other GPUs (one or two per pair), no
# NVSwitch. GPUs 0-3 on socket 0, 4-7 on socket 1, in pairs behind one
# PCIe switch. Unlike the NVSwitch profiles, go-gpuallocator sees these
# links (it does not follow NVLinks into a switch), so this is where the
# two policies differ most.
# The format is described in e2e/profiles/README.md.

driver 550.54.15
nvml   12.550.54.15
cuda   12040

defaults name="Tesla V100-SXM2-32GB" memory=32768 arch=volta cc=7.0 brand=tesla pciid=0x1db510de
defaults temp=35 slowdown=87 shutdown=90 maxtemp=83

gpu 0 uuid=GPU-0a1e1c2d-0000-4000-8000-000000000000 bus=0000:06:00.0 minor=0 numa=0 nvlink=gpu1*1,gpu2*1,gpu3*2,gpu4*2
gpu 1 uuid=GPU-0a1e1c2d-0000-4000-8000-000000000001 bus=0000:07:00.0 minor=1 numa=0 nvlink=gpu0*1,gpu2*2,gpu3*1,gpu5*2
gpu 2 uuid=GPU-0a1e1c2d-0000-4000-8000-000000000002 bus=0000:0a:00.0 minor=2 numa=0 nvlink=gpu0*1,gpu1*2,gpu3*2,gpu6*1
gpu 3 uuid=GPU-0a1e1c2d-0000-4000-8000-000000000003 bus=0000:0b:00.0 minor=3 numa=0 nvlink=gpu0*2,gpu1*1,gpu2*2,gpu7*1
gpu 4 uuid=GPU-0a1e1c2d-0000-4000-8000-000000000004 bus=0000:85:00.0 minor=4 numa=1 nvlink=gpu0*2,gpu5*1,gpu6*1,gpu7*2
gpu 5 uuid=GPU-0a1e1c2d-0000-4000-8000-000000000005 bus=0000:86:00.0 minor=5 numa=1 nvlink=gpu1*2,gpu4*1,gpu6*2,gpu7*1
gpu 6 uuid=GPU-0a1e1c2d-0000-4000-8000-000000000006 bus=0000:89:00.0 minor=6 numa=1 nvlink=gpu2*1,gpu4*1,gpu5*2,gpu7*2
gpu 7 uuid=GPU-0a1e1c2d-0000-4000-8000-000000000007 bus=0000:8a:00.0 minor=7 numa=1 nvlink=gpu3*1,gpu4*2,gpu5*1,gpu6*2

pcie node same-numa
pcie single 0 1
pcie single 2 3
pcie single 4 5
pcie single 6 7
