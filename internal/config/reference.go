package config

import (
	"fmt"
	"strings"
)

// ReferencePath is the generated settings reference, relative to the
// repository root; TestReference keeps it in step with Settings.
const ReferencePath = "docs/configuration.md"

// fileOnly are the keys the config file alone takes: nested values no flag
// could hold.
var fileOnly = []struct{ key, usage string }{
	{"nicResources", "NIC pools: which NICs each resource serves ([NIC pools](nic-pools.md))"},
	{"sharing", "GPU sharing: `timeSlicing`, `mps` ([MIG and GPU sharing](mig-and-sharing.md)); `memoryShares` and `migPartitions`, DRA mode's ([DRA mode](dra.md#claim-configuration), [MIG partitions](dra.md#mig-partitions-created-on-demand))"},
}

// Reference is the settings reference in Markdown, grouped by category,
// made from Settings: the docs cannot name a key, flag, variable or default
// the binary does not have.
func Reference() string {
	var b strings.Builder
	b.WriteString("# Configuration reference\n\n")
	b.WriteString("<!-- Generated from config.Settings by `go test ./internal/config -run TestReference -update`; do not edit. -->\n\n")
	b.WriteString("Every setting of the plugin, with its default and what it does, grouped as `serve --help`\n")
	b.WriteString("groups them. The chart's own values are in its `values.yaml`.\n\n")
	settings := Settings()
	var off []string
	for _, s := range settings {
		if s.EmptyOff {
			off = append(off, "`"+s.Key+"`")
		}
	}
	b.WriteString("Every setting has a config-file key, a flag and an environment variable. Precedence, highest\n")
	b.WriteString("first: a flag (before or after the command; given both before and after, the one after wins),\n")
	b.WriteString("the environment variable, the `--config` file (`" + EnvName("config") + "`), the default.\n")
	b.WriteString("An empty environment variable counts as unset, except for the settings whose empty value turns\n")
	b.WriteString("something off, where it turns it off as an empty flag does: " + strings.Join(off, ", ") + ".\n")
	b.WriteString("`serve` takes every flag; `list`, `allocate`, `cdi generate`, `mps-launcher`, `probe`, `remediation`\n")
	b.WriteString("and `version` take the ones they read (their `--help` lists them) after the command, and every\n")
	b.WriteString("flag before it.\n")
	for _, cat := range Categories() {
		fmt.Fprintf(&b, "\n## %s\n\n| key | flag | environment | default | meaning |\n|---|---|---|---|---|\n", cat)
		for _, s := range settings {
			if s.Category != cat {
				continue
			}
			def := "`" + s.Default + "`"
			if s.Default == "" {
				def = "empty"
			}
			fmt.Fprintf(&b, "| `%s` | `--%s` | `%s` | %s | %s |\n", s.Key, s.Flag, s.Env, def, escapeCell(s.Usage))
		}
	}
	b.WriteString("\n## File only\n\n| key | meaning |\n|---|---|\n")
	for _, f := range fileOnly {
		fmt.Fprintf(&b, "| `%s` | %s |\n", f.key, f.usage)
	}
	b.WriteString("\n### sharing.mps: what holds\n\n")
	b.WriteString("A container's MPS limits come from two places. The GPU's control daemon sets each client's\n")
	b.WriteString("limit, and that holds whatever the container does. The container's environment\n")
	b.WriteString("(`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`) can only narrow it,\n")
	b.WriteString("and a container can clear its own environment.\n\n")
	b.WriteString("| key | default | meaning |\n|---|---|---|\n")
	for _, k := range mpsKeys() {
		fmt.Fprintf(&b, "| `sharing.mps.%s` | %s | %s |\n", k.key, k.def, escapeCell(k.usage))
	}
	return b.String()
}

// mpsKey is one key of sharing.mps as the reference explains it.
type mpsKey struct{ key, def, usage string }

// mpsKeys are the sharing.mps keys whose meaning is what holds against a
// container; TestMPSKeysAreReal keeps them keys of MPS.
func mpsKeys() []mpsKey {
	return []mpsKey{
		{"maxSharesPerContainer", "`1`", "the most shares of one GPU a container may hold, from 1 to the fewest `replicas` of the entries; Allocate refuses more. " +
			"The daemon holds every client process to this many shares of its GPU's threads and pinned memory: that holds. " +
			"With 1, each client process gets one share and no more. " +
			"Above 1, a container holding fewer shares is narrowed to them by its environment only, and one that clears it gets this many"},
		{"failRequestsGreaterThanOne", "`false`", "taken for NVIDIA's format; one share per container is the default here, so `true` changes nothing. " +
			"It may not be `true` beside a `maxSharesPerContainer` above 1"},
	}
}

func escapeCell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
