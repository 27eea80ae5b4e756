# hgx-16: sixteen H100 SXM5 in two 8-GPU HGX baseboards. Each board is an
# NVLink island with its own four NVSwitches; GPUs on different boards share
# no NVLink. Board 0 hangs off socket 0, board 1 off socket 1, and the GPUs
# come in pairs behind one PCIe switch.
# The format is described in README.md and at the top of dgx-h100.profile.

driver 550.54.15
nvml   12.550.54.15
cuda   12040

nvswitch a0 0000:0a:00.0
nvswitch a1 0000:0b:00.0
nvswitch a2 0000:0c:00.0
nvswitch a3 0000:0d:00.0
nvswitch b0 0000:8a:00.0
nvswitch b1 0000:8b:00.0
nvswitch b2 0000:8c:00.0
nvswitch b3 0000:8d:00.0

defaults name="NVIDIA H100 80GB HBM3" memory=81559 arch=hopper cc=9.0 brand=nvidia pciid=0x233010de
defaults temp=33 slowdown=90 shutdown=92 maxtemp=87

# Board 0, socket 0.
defaults numa=0 nvlink=a0*5,a1*4,a2*4,a3*5
gpu 0  uuid=GPU-e58b0810-06f7-e3df-c967-a64cb14028d5 bus=0000:1b:00.0 minor=0
gpu 1  uuid=GPU-12c9791e-558e-08ba-a719-6b50ac2f8670 bus=0000:1c:00.0 minor=1
gpu 2  uuid=GPU-2824c1c0-9972-4caf-4941-d4072014b3ce bus=0000:3d:00.0 minor=2
gpu 3  uuid=GPU-107f80e2-22f8-2876-7efc-2f91624a8940 bus=0000:3e:00.0 minor=3
gpu 4  uuid=GPU-f1f836f9-9eee-3692-f09e-2e8c662248b4 bus=0000:4f:00.0 minor=4
gpu 5  uuid=GPU-83b7ffc0-50fe-c94d-bca3-a0aac36098b2 bus=0000:50:00.0 minor=5
gpu 6  uuid=GPU-cc2bd818-3194-78da-6bd0-c621de49f145 bus=0000:61:00.0 minor=6
gpu 7  uuid=GPU-fda9988c-79fc-3552-6f7e-aed46725a2a7 bus=0000:62:00.0 minor=7

# Board 1, socket 1.
defaults numa=1 nvlink=b0*5,b1*4,b2*4,b3*5
gpu 8  uuid=GPU-b860dcd6-c8a1-f8b4-6287-cced9041dff0 bus=0000:9b:00.0 minor=8
gpu 9  uuid=GPU-2cee7374-43e2-1047-1948-d33296c87009 bus=0000:9c:00.0 minor=9
gpu 10 uuid=GPU-e8a7f770-d910-6fd2-87db-7f1adbc60926 bus=0000:bd:00.0 minor=10
gpu 11 uuid=GPU-f6967e78-93f5-7fd1-4c16-04d115cea325 bus=0000:be:00.0 minor=11
gpu 12 uuid=GPU-a65e19cb-ae53-0282-bd36-cb9d21f6be6a bus=0000:cf:00.0 minor=12
gpu 13 uuid=GPU-bf0d7c1c-1e21-862a-b8a1-8a8902073fec bus=0000:d0:00.0 minor=13
gpu 14 uuid=GPU-8df4f509-47aa-eb26-c57d-21fa5d328263 bus=0000:e1:00.0 minor=14
gpu 15 uuid=GPU-dfe574de-7399-88b8-86e7-577496a2c877 bus=0000:e2:00.0 minor=15

pcie node same-numa
pcie single 0 1
pcie single 2 3
pcie single 4 5
pcie single 6 7
pcie single 8 9
pcie single 10 11
pcie single 12 13
pcie single 14 15
