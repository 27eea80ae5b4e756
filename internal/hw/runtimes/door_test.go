package runtimes

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// tree writes files (host path: content) under a new root.
func tree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

const (
	containerdV2NVIDIADefault = `version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "nvidia"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
      BinaryName = "/usr/bin/nvidia-container-runtime"
`
	containerdV2NVIDIAHandler = `version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runc"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
    BinaryName = "/usr/bin/nvidia-container-runtime"
`
	containerdV3NVIDIADefault = `version = 3
[plugins."io.containerd.cri.v1.runtime".containerd]
  default_runtime_name = "nvidia"
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia.options]
    BinaryName = "/usr/bin/nvidia-container-runtime"
`
	containerdV3NVIDIAHandler = `version = 3
[plugins."io.containerd.cri.v1.runtime".containerd]
  default_runtime_name = "runc"
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia.options]
    BinaryName = "/usr/bin/nvidia-container-runtime"
`
	toolkitClosed = `accept-nvidia-visible-devices-envvar-when-unprivileged = false
accept-nvidia-visible-devices-as-volume-mounts = true
`
	nvidiaHook = `{
  "version": "1.0.0",
  "hook": {"path": "/usr/bin/nvidia-container-runtime-hook", "args": ["nvidia-container-runtime-hook", "prestart"]},
  "when": {"always": true, "commands": [".*"]},
  "stages": ["prestart"]
}`
)

func TestInspect(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
		want  Door // Err, Fix and Mode are checked apart
	}{
		// No NVIDIA runtime.
		{name: "nothing configured", files: nil,
			want: Door{State: Closed, Reason: ReasonNoNVIDIARuntime}},
		{name: "toolkit config alone opens nothing",
			files: map[string]string{ToolkitConfig: "# defaults\n", "/etc/containerd/config.toml": "version = 2\n"},
			want:  Door{State: Closed, Reason: ReasonNoNVIDIARuntime}},

		// The toolkit's config, with containerd running NVIDIA's runtime by default.
		{name: "toolkit config absent: the toolkit's default accepts the variable",
			files: map[string]string{"/etc/containerd/config.toml": containerdV2NVIDIADefault},
			want:  Door{State: Open, Reason: ReasonEnvvarAccepted, Runtime: Containerd, ConfigPath: ToolkitConfig, Key: KeyAcceptEnvvar}},
		{name: "toolkit config without the key is the default",
			files: map[string]string{"/etc/containerd/config.toml": containerdV2NVIDIADefault, ToolkitConfig: "[nvidia-container-cli]\nldconfig = \"@/sbin/ldconfig\"\n"},
			want:  Door{State: Open, Reason: ReasonEnvvarAccepted, Runtime: Containerd, ConfigPath: ToolkitConfig, Key: KeyAcceptEnvvar}},
		{name: "toolkit config refuses the variable from unprivileged containers",
			files: map[string]string{"/etc/containerd/config.toml": containerdV2NVIDIADefault, ToolkitConfig: toolkitClosed},
			want:  Door{State: Closed, Reason: ReasonEnvvarRefused, Runtime: Containerd, ConfigPath: ToolkitConfig, Key: KeyAcceptEnvvar}},
		{name: "volume mounts alone leave the variable as a fallback",
			files: map[string]string{"/etc/containerd/config.toml": containerdV2NVIDIADefault, ToolkitConfig: KeyAcceptVolumeMounts + " = true\n"},
			want:  Door{State: Open, Reason: ReasonEnvvarAccepted, Runtime: Containerd, ConfigPath: ToolkitConfig, Key: KeyAcceptEnvvar}},
		{name: "cdi mode still maps the variable to CDI devices",
			files: map[string]string{"/etc/containerd/config.toml": containerdV2NVIDIADefault, ToolkitConfig: "[nvidia-container-runtime]\nmode = \"cdi\"\n"},
			want:  Door{State: Open, Reason: ReasonEnvvarAccepted, Runtime: Containerd, ConfigPath: ToolkitConfig, Key: KeyAcceptEnvvar, Mode: "cdi"}},
		{name: "malformed toolkit config is unknown",
			files: map[string]string{"/etc/containerd/config.toml": containerdV2NVIDIADefault, ToolkitConfig: "accept-nvidia-visible-devices-envvar-when-unprivileged = \n"},
			want:  Door{State: Unknown, Reason: ReasonUnreadableConfig, Runtime: Containerd, ConfigPath: ToolkitConfig, Key: KeyAcceptEnvvar}},
		{name: "toolkit key of the wrong type is unknown",
			files: map[string]string{"/etc/containerd/config.toml": containerdV2NVIDIADefault, ToolkitConfig: KeyAcceptEnvvar + " = \"no\"\n"},
			want:  Door{State: Unknown, Reason: ReasonUnreadableConfig, Runtime: Containerd, ConfigPath: ToolkitConfig, Key: KeyAcceptEnvvar}},
		{name: "GPU Operator's toolkit config beside its runtime decides, not /etc's",
			files: map[string]string{
				"/etc/containerd/config.toml":                                            strings.ReplaceAll(containerdV2NVIDIADefault, "/usr/bin/", "/usr/local/nvidia/toolkit/"),
				"/usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml": "# defaults\n",
				ToolkitConfig: toolkitClosed},
			want: Door{State: Open, Reason: ReasonEnvvarAccepted, Runtime: Containerd, ConfigPath: "/usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml", Key: KeyAcceptEnvvar}},

		// containerd.
		{name: "containerd v2: NVIDIA's runtime as a handler only",
			files: map[string]string{"/etc/containerd/config.toml": containerdV2NVIDIAHandler},
			want:  Door{State: Closed, Reason: ReasonNotDefault, Runtime: Containerd, ConfigPath: "/etc/containerd/config.toml", Key: `plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options.BinaryName`}},
		{name: "containerd v3: NVIDIA's runtime as the default",
			files: map[string]string{"/etc/containerd/config.toml": containerdV3NVIDIADefault},
			want:  Door{State: Open, Reason: ReasonEnvvarAccepted, Runtime: Containerd, ConfigPath: ToolkitConfig, Key: KeyAcceptEnvvar}},
		{name: "containerd v3: NVIDIA's runtime as a handler only",
			files: map[string]string{"/etc/containerd/config.toml": containerdV3NVIDIAHandler},
			want:  Door{State: Closed, Reason: ReasonNotDefault, Runtime: Containerd, ConfigPath: "/etc/containerd/config.toml", Key: `plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia.options.BinaryName`}},
		{name: "containerd v3 does not read version 2's CRI table",
			files: map[string]string{"/etc/containerd/config.toml": strings.Replace(containerdV2NVIDIADefault, "version = 2", "version = 3", 1)},
			want:  Door{State: Closed, Reason: ReasonNoNVIDIARuntime}},
		{name: "containerd v1: the cri plugin's default",
			files: map[string]string{"/etc/containerd/config.toml": "[plugins.cri.containerd]\ndefault_runtime_name = \"nvidia\"\n[plugins.cri.containerd.runtimes.nvidia.options]\nBinaryName = \"nvidia-container-runtime\"\n"},
			want:  Door{State: Open, Reason: ReasonEnvvarAccepted, Runtime: Containerd, ConfigPath: ToolkitConfig, Key: KeyAcceptEnvvar}},
		{name: "containerd: a drop-in imported by glob makes NVIDIA's runtime the default",
			files: map[string]string{
				"/etc/containerd/config.toml":           "version = 2\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n",
				"/etc/containerd/conf.d/99-nvidia.toml": containerdV2NVIDIADefault},
			want: Door{State: Open, Reason: ReasonEnvvarAccepted, Runtime: Containerd, ConfigPath: ToolkitConfig, Key: KeyAcceptEnvvar}},
		{name: "containerd: a later drop-in puts runc back as the default",
			files: map[string]string{
				"/etc/containerd/config.toml":           "version = 2\nimports = [\"conf.d/*.toml\"]\n",
				"/etc/containerd/conf.d/10-nvidia.toml": containerdV2NVIDIADefault,
				"/etc/containerd/conf.d/20-runc.toml":   "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\ndefault_runtime_name = \"runc\"\n"},
			want: Door{State: Closed, Reason: ReasonNotDefault, Runtime: Containerd, ConfigPath: "/etc/containerd/conf.d/10-nvidia.toml", Key: `plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options.BinaryName`}},
		{name: "containerd: k3s's generated config",
			files: map[string]string{"/var/lib/rancher/k3s/agent/etc/containerd/config.toml": containerdV2NVIDIADefault},
			want:  Door{State: Open, Reason: ReasonEnvvarAccepted, Runtime: Containerd, ConfigPath: ToolkitConfig, Key: KeyAcceptEnvvar}},
		{name: "containerd: malformed config is unknown",
			files: map[string]string{"/etc/containerd/config.toml": "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"\n"},
			want:  Door{State: Unknown, Reason: ReasonUnreadableConfig, Runtime: Containerd, ConfigPath: "/etc/containerd/config.toml"}},

		// CRI-O.
		{name: "CRI-O: a drop-in makes NVIDIA's runtime the default",
			files: map[string]string{
				"/etc/crio/crio.conf":                  "[crio.runtime]\ndefault_runtime = \"crun\"\n",
				"/etc/crio/crio.conf.d/99-nvidia.conf": "[crio.runtime]\ndefault_runtime = \"nvidia\"\n[crio.runtime.runtimes.nvidia]\nruntime_path = \"/usr/bin/nvidia-container-runtime\"\nruntime_type = \"oci\"\n"},
			want: Door{State: Open, Reason: ReasonEnvvarAccepted, Runtime: CRIO, ConfigPath: ToolkitConfig, Key: KeyAcceptEnvvar}},
		{name: "CRI-O: NVIDIA's runtime as a handler only",
			files: map[string]string{
				"/etc/crio/crio.conf.d/99-nvidia.conf": "[crio.runtime.runtimes.nvidia]\nruntime_path = \"/usr/bin/nvidia-container-runtime\"\n"},
			want: Door{State: Closed, Reason: ReasonNotDefault, Runtime: CRIO, ConfigPath: "/etc/crio/crio.conf.d/99-nvidia.conf", Key: "crio.runtime.runtimes.nvidia.runtime_path"}},
		{name: "CRI-O: the default with the toolkit refusing the variable",
			files: map[string]string{
				"/etc/crio/crio.conf": "[crio.runtime]\ndefault_runtime = \"nvidia\"\n[crio.runtime.runtimes.nvidia]\nruntime_path = \"/usr/bin/nvidia-container-runtime\"\n",
				ToolkitConfig:         toolkitClosed},
			want: Door{State: Closed, Reason: ReasonEnvvarRefused, Runtime: CRIO, ConfigPath: ToolkitConfig, Key: KeyAcceptEnvvar}},
		{name: "CRI-O: malformed drop-in is unknown",
			files: map[string]string{"/etc/crio/crio.conf.d/50-bad.conf": "[crio.runtime\n"},
			want:  Door{State: Unknown, Reason: ReasonUnreadableConfig, Runtime: CRIO, ConfigPath: "/etc/crio/crio.conf.d/50-bad.conf"}},

		// The legacy OCI hook.
		{name: "hooks.d: NVIDIA's hook for every container",
			files: map[string]string{"/usr/share/containers/oci/hooks.d/oci-nvidia-hook.json": nvidiaHook},
			want:  Door{State: Open, Reason: ReasonEnvvarAccepted, Runtime: OCIHook, ConfigPath: ToolkitConfig, Key: KeyAcceptEnvvar}},
		{name: "hooks.d: NVIDIA's hook with the toolkit refusing the variable",
			files: map[string]string{"/etc/containers/oci/hooks.d/oci-nvidia-hook.json": nvidiaHook, ToolkitConfig: toolkitClosed},
			want:  Door{State: Closed, Reason: ReasonEnvvarRefused, Runtime: OCIHook, ConfigPath: ToolkitConfig, Key: KeyAcceptEnvvar}},
		{name: "hooks.d: /etc's file of the same name gates the hook on an annotation",
			files: map[string]string{
				"/usr/share/containers/oci/hooks.d/oci-nvidia-hook.json": nvidiaHook,
				"/etc/containers/oci/hooks.d/oci-nvidia-hook.json":       strings.Replace(nvidiaHook, `"always": true, "commands": [".*"]`, `"annotations": {"gpu": "yes"}`, 1)},
			want: Door{State: Closed, Reason: ReasonNotDefault, Runtime: OCIHook, ConfigPath: "/etc/containers/oci/hooks.d/oci-nvidia-hook.json", Key: "when"}},
		{name: "hooks.d: a 0.1.0 hook without conditions runs always",
			files: map[string]string{"/etc/containers/oci/hooks.d/nvidia.json": `{"hook": "/usr/bin/nvidia-container-toolkit", "stage": ["prestart"]}`},
			want:  Door{State: Open, Reason: ReasonEnvvarAccepted, Runtime: OCIHook, ConfigPath: ToolkitConfig, Key: KeyAcceptEnvvar}},
		{name: "hooks.d: malformed NVIDIA hook is unknown",
			files: map[string]string{"/etc/containers/oci/hooks.d/nvidia.json": `{"hook": {"path": "/usr/bin/nvidia-container-runtime-hook"`},
			want:  Door{State: Unknown, Reason: ReasonUnreadableConfig, Runtime: OCIHook, ConfigPath: "/etc/containers/oci/hooks.d/nvidia.json"}},
		{name: "hooks.d: another program's malformed hook says nothing",
			files: map[string]string{"/etc/containers/oci/hooks.d/other.json": `{"hook": `},
			want:  Door{State: Closed, Reason: ReasonNoNVIDIARuntime}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Inspect(tree(t, tt.files))
			if tt.want.State == Unknown && got.Err == nil {
				t.Errorf("unknown without an error: %+v", got)
			}
			if tt.want.State != Unknown && got.Err != nil {
				t.Errorf("error %v", got.Err)
			}
			if (got.Fix != "") != (tt.want.State != Closed) {
				t.Errorf("fix %q for a door %s", got.Fix, got.State)
			}
			if tt.want.Mode == "" && got.State != Unknown && got.Reason != ReasonNoNVIDIARuntime && got.Reason != ReasonNotDefault {
				tt.want.Mode = "auto"
			}
			got.Err, got.Fix = nil, ""
			if got != tt.want {
				t.Errorf("Inspect:\n got %+v\nwant %+v", got, tt.want)
			}
			if got.IsOpen() != (tt.want.State == Open) || (got.Sentence() == "") != (tt.want.State == Closed) {
				t.Errorf("IsOpen %v, Sentence %q for %s", got.IsOpen(), got.Sentence(), got.State)
			}
		})
	}
}

// The fix names the toolkit's keys and the file to put them in, and the
// sentence the runtime and the file, so a reader can act on either.
func TestOpenDoorSaysWhatToChange(t *testing.T) {
	d := Inspect(tree(t, map[string]string{"/etc/containerd/config.toml": containerdV3NVIDIADefault}))
	for _, want := range []string{KeyAcceptEnvvar + " = false", KeyAcceptVolumeMounts + " = true", ToolkitConfig, "RuntimeClass"} {
		if !strings.Contains(d.Fix, want) {
			t.Errorf("fix %q does not say %q", d.Fix, want)
		}
	}
	for _, want := range []string{"containerd", ToolkitConfig, "NVIDIA_VISIBLE_DEVICES"} {
		if !strings.Contains(d.Sentence(), want) {
			t.Errorf("sentence %q does not say %q", d.Sentence(), want)
		}
	}
}
