# dgx-h100-mig: the DGX H100 of dgx-h100.profile (same NVLink and PCIe
# topology) with MIG on four GPUs, covering each MIG shape the plugin meets:
#   GPU 0  mixed split: one 3g.40gb and two 2g.20gb (7 of 7 slices)
#   GPU 1  seven 1g.10gb, every MIG device slot full
#   GPU 2  MIG on with no instances created: no MIG device, nothing to serve
#   GPU 3  a 1g.10gb+me (the media-engine profile, NVML's 1_SLICE_REV1) and a
#          3g.40gb GPU instance holding one one-slice compute instance
#          (1c.3g.40gb), the other two compute slices left unused
#   GPUs 4-7  MIG off
# Figures are an H100 80GB's: 1g 9856 MiB and 16 SMs, 2g 20096 MiB and 32,
# 3g 40192 MiB and 60 (a one-slice compute instance of it gets 16, as a 1g
# has); giprofile is NVML's profile index, NVML_GPU_INSTANCE_PROFILE_*
# (1g 0, 2g 1, 3g 2, 1g+me 7), and NVML reports an H100's profile IDs for
# them (19, 14, 9, 20), not the index. GPU instance ids are the ones the
# driver gives each placement: GPU 0's 3g.40gb gi2 lies at memory slices
# 4:4 and its 2g.20gbs gi3 and gi4 at 0:2 and 2:2, GPU 1's 1g.10gbs gi7 to
# gi13 at 0 to 6, GPU 3's 1g.10gb+me gi13 at 6:1 and 3g.40gb gi1 at 0:4.
#
# mig <gpu> gi= ci= profile= giprofile= slices= cislices= memory= sms= uuid=
# declares one MIG device of a gpu with mig=on; its MIG device index is the
# order of that GPU's mig lines. The format is described in README.md and at
# the top of dgx-h100.profile.

driver 550.54.15
nvml   12.550.54.15
cuda   12040

nvswitch nvs0 0000:05:00.0
nvswitch nvs1 0000:06:00.0
nvswitch nvs2 0000:07:00.0
nvswitch nvs3 0000:08:00.0

defaults name="NVIDIA H100 80GB HBM3" memory=81559 arch=hopper cc=9.0 brand=nvidia pciid=0x233010de
defaults temp=33 slowdown=90 shutdown=92 maxtemp=87
defaults nvlink=nvs0*5,nvs1*4,nvs2*4,nvs3*5 mig=off

gpu 0 uuid=GPU-48f165d5-7b00-47f4-b81e-f86f5c8cc1ab bus=0000:18:00.0 minor=0 numa=0 mig=on
gpu 1 uuid=GPU-017f9ee6-725e-409d-ba05-62d56abd685a bus=0000:2a:00.0 minor=1 numa=0 mig=on
gpu 2 uuid=GPU-b6043106-a85f-48b6-9aa8-b2a668d605d4 bus=0000:3a:00.0 minor=2 numa=0 mig=on
gpu 3 uuid=GPU-38f12d92-a28f-47d8-bce4-4e27424458b6 bus=0000:5d:00.0 minor=3 numa=0 mig=on
gpu 4 uuid=GPU-d09e0492-4d52-4c61-8bed-ce030297c5e5 bus=0000:9a:00.0 minor=4 numa=1
gpu 5 uuid=GPU-f3a16071-2456-4e76-aaad-d6b855c6b62b bus=0000:ab:00.0 minor=5 numa=1
gpu 6 uuid=GPU-05adb3fc-4f63-4127-9a23-bef7be506564 bus=0000:ba:00.0 minor=6 numa=1
gpu 7 uuid=GPU-9a508bb1-f4c9-4a65-b868-e6d9ca0bc36c bus=0000:db:00.0 minor=7 numa=1

mig 0 gi=2  ci=0 profile=3g.40gb    giprofile=2 slices=3 cislices=3 memory=40192 sms=60 uuid=MIG-2769e927-e4bf-4564-8537-2ef440e5c51e
mig 0 gi=3  ci=0 profile=2g.20gb    giprofile=1 slices=2 cislices=2 memory=20096 sms=32 uuid=MIG-a1865506-aadb-4831-9b25-f81fcec1496e
mig 0 gi=4  ci=0 profile=2g.20gb    giprofile=1 slices=2 cislices=2 memory=20096 sms=32 uuid=MIG-994395a7-74f0-447f-b6f8-7a640701ad82

mig 1 gi=7  ci=0 profile=1g.10gb    giprofile=0 slices=1 cislices=1 memory=9856  sms=16 uuid=MIG-fc45228f-4bd5-41b0-b41b-5669a0729b23
mig 1 gi=8  ci=0 profile=1g.10gb    giprofile=0 slices=1 cislices=1 memory=9856  sms=16 uuid=MIG-5c9dc8b6-4f4e-48e5-885b-d78d396e0d55
mig 1 gi=9  ci=0 profile=1g.10gb    giprofile=0 slices=1 cislices=1 memory=9856  sms=16 uuid=MIG-1600314a-c9ae-49cf-ab97-8d7d421bb123
mig 1 gi=10 ci=0 profile=1g.10gb    giprofile=0 slices=1 cislices=1 memory=9856  sms=16 uuid=MIG-844948a8-6c51-4e92-be89-f91859082551
mig 1 gi=11 ci=0 profile=1g.10gb    giprofile=0 slices=1 cislices=1 memory=9856  sms=16 uuid=MIG-900977a9-f2c9-4386-ac19-9bd3a49d1ce2
mig 1 gi=12 ci=0 profile=1g.10gb    giprofile=0 slices=1 cislices=1 memory=9856  sms=16 uuid=MIG-48658079-0b44-445f-9429-523c4b037d52
mig 1 gi=13 ci=0 profile=1g.10gb    giprofile=0 slices=1 cislices=1 memory=9856  sms=16 uuid=MIG-fffc3436-d523-483b-9567-24d0f9507c87

mig 3 gi=13 ci=0 profile=1g.10gb+me giprofile=7 slices=1 cislices=1 memory=9856  sms=16 uuid=MIG-5f81639e-85fb-4058-8195-2061ca532551
mig 3 gi=1  ci=0 profile=1c.3g.40gb giprofile=2 slices=3 cislices=1 memory=40192 sms=16 uuid=MIG-4f126160-278d-4da9-bd69-33b93c1be0d0

# Each GPU sits behind its own PCIe switch off its own root port.
pcie node same-numa
