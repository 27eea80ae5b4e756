# gb200-tray: one compute tray of a GB200 NVL72 rack. Two Grace CPUs, each
# with two B200 GPUs on its NUMA node. Every GPU's 18 NVLinks lead to the
# rack's NVLink switch trays, outside this node: the mock does not model those
# links (no nvlink key), only what NVML's fabric info says of them. All four
# GPUs are registered in one NVLink domain (cluster UUID) and one clique of
# it, so the node is labelled nvidia.com/gpu.clique=<cluster UUID>.<clique>.
# The format is described in README.md and at the top of dgx-h100.profile.

driver 570.133.20
nvml   12.570.133.20
cuda   12080

defaults name="NVIDIA GB200" memory=189471 arch=blackwell cc=10.0 brand=nvidia pciid=0x294110de
defaults temp=35 slowdown=87 shutdown=92 maxtemp=85
defaults fabric=6c3f2a1e-9b7d-4e58-a0c4-1d2e3f405162:32766

gpu 0 uuid=GPU-1b8e4c2a-5d6f-4a7b-8c9d-0e1f2a3b4c5d bus=0008:01:00.0 minor=0 numa=0
gpu 1 uuid=GPU-2c9f5d3b-6e70-4b8c-9dae-1f203b4c5d6e bus=0009:01:00.0 minor=1 numa=0
gpu 2 uuid=GPU-3da06e4c-7f81-4c9d-aebf-20314c5d6e7f bus=0018:01:00.0 minor=2 numa=1
gpu 3 uuid=GPU-4eb17f5d-8092-4dae-bfc0-31425d6e7f80 bus=0019:01:00.0 minor=3 numa=1

# Each GPU on its own root port; the two of a Grace CPU share its NUMA node.
pcie node same-numa
