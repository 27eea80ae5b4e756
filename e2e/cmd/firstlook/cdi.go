package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// cdiSpec is the part of a CDI spec the first look prints.
type cdiSpec struct {
	Kind    string      `json:"kind"`
	Devices []cdiDevice `json:"devices"`
	Edits   cdiEdits    `json:"containerEdits"`
}

type cdiDevice struct {
	Name  string   `json:"name"`
	Edits cdiEdits `json:"containerEdits"`
}

type cdiEdits struct {
	Env         []string `json:"env"`
	DeviceNodes []struct {
		Path string `json:"path"`
	} `json:"deviceNodes"`
	Mounts []struct {
		ContainerPath string `json:"containerPath"`
	} `json:"mounts"`
	Hooks []struct {
		HookName string `json:"hookName"`
		Path     string `json:"path"`
	} `json:"hooks"`
}

func (e cdiEdits) nodes() []string {
	var p []string
	for _, d := range e.DeviceNodes {
		p = append(p, d.Path)
	}
	return p
}

// writeCDI prints what the CDI names of an Allocate answer give the
// container, from the spec in dir that defines them, as a container
// runtime resolves them.
func writeCDI(w io.Writer, dir string, r *api.ContainerAllocateResponse) error {
	if len(r.CdiDevices) == 0 {
		return nil
	}
	kind, _, _ := strings.Cut(r.CdiDevices[0].Name, "=")
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return err
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var spec cdiSpec
		if err := json.Unmarshal(b, &spec); err != nil {
			return fmt.Errorf("CDI spec %s: %w", f, err)
		}
		if spec.Kind != kind {
			continue
		}
		var own []string
		for _, d := range r.CdiDevices {
			_, name, _ := strings.Cut(d.Name, "=")
			i := slices.IndexFunc(spec.Devices, func(sd cdiDevice) bool { return sd.Name == name })
			if i < 0 {
				return fmt.Errorf("CDI spec %s does not define %s", f, d.Name)
			}
			own = append(own, spec.Devices[i].Edits.nodes()...)
		}
		fmt.Fprintf(w, "The container runtime looks them up in the CDI spec serve wrote (%s), and the container gets:\n", filepath.Base(f))
		fmt.Fprintf(w, "  device  %s   (its GPUs)\n", strings.Join(own, ", "))
		if n := spec.Edits.nodes(); len(n) > 0 {
			fmt.Fprintf(w, "  device  %s   (every GPU container)\n", strings.Join(n, ", "))
		}
		var mounts []string
		for _, m := range spec.Edits.Mounts {
			mounts = append(mounts, m.ContainerPath)
		}
		if len(mounts) > 0 {
			fmt.Fprintf(w, "  mount   %s   (the driver's files, read-only)\n", strings.Join(mounts, ", "))
		}
		for _, e := range spec.Edits.Env {
			fmt.Fprintf(w, "  env     %s\n", e)
		}
		for _, h := range spec.Edits.Hooks {
			fmt.Fprintf(w, "  hook    %s %s\n", h.HookName, h.Path)
		}
		return nil
	}
	return fmt.Errorf("no CDI spec of kind %s in %s", kind, dir)
}
