package config

import "testing"

func TestGPUSelected(t *testing.T) {
	const (
		uuid  = "GPU-a4c123b1-612d-d272-d137-1c17149d4395"
		bus   = "0000:18:00.0"
		model = "NVIDIA H100 80GB HBM3"
	)
	for _, tt := range []struct {
		include, exclude []string
		want             bool
	}{
		{nil, nil, true},
		{nil, []string{uuid}, false},
		{nil, []string{"gpu-A4C123B1-612d-d272-d137-1c17149d4395"}, false},
		{nil, []string{"3"}, false},
		{nil, []string{"4"}, true},
		{nil, []string{"18:00.0"}, false},
		{nil, []string{"00000000:18:00.0"}, false},
		{nil, []string{"0000:19:00.0"}, true},
		{nil, []string{"nvidia h100 80gb hbm3"}, false},
		{nil, []string{"NVIDIA A100-SXM4-40GB"}, true},
		{[]string{"3"}, nil, true},
		{[]string{"5", "NVIDIA A10"}, nil, false},
		{[]string{model}, []string{"3"}, false},
	} {
		c := Config{IncludeGPUs: tt.include, ExcludeGPUs: tt.exclude}
		if got := c.GPUSelected(3, uuid, bus, model); got != tt.want {
			t.Errorf("include %v exclude %v: selected %v, want %v", tt.include, tt.exclude, got, tt.want)
		}
	}
}

func TestCanonicalPCI(t *testing.T) {
	for in, want := range map[string]string{
		"18:00.0": "0000:18:00.0", "0000:18:00.0": "0000:18:00.0", "00000000:1A:00.7": "0000:1a:00.7",
		"1:18:00.0": "0001:18:00.0", "18:00.8": "", "GPU-1": "", "12345:18:00.0": "",
	} {
		if got := canonicalPCI(in); got != want {
			t.Errorf("canonicalPCI(%q) = %q, want %q", in, got, want)
		}
	}
}
