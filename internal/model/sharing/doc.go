// Package sharing decides how GPUs are shared between containers, in no
// kubelet API's terms. Two ideas live here, named apart:
//
//   - replicas (device-plugin mode): how many times a device is
//     advertised, under which resource name, through time-slicing or MPS,
//     and how many MPS shares one container may hold (Rules, TimeSlicing,
//     MPS);
//   - the time-slice interval (DRA mode): how long each process of a
//     claim's GPU runs before the GPU switches (Intervals).
//
// It parses nothing: package config reads and checks the settings, and the
// daemon copies them into these types. It must not import config or any
// front-end.
package sharing
