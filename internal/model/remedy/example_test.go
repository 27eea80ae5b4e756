package remedy_test

import (
	"fmt"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/remedy"
)

// The driver asks for a reset of one GPU: it is withheld, reset once
// idle, probed, and given back.
func Example() {
	t := time.Date(2026, 11, 27, 6, 0, 0, 0, time.UTC)
	node := remedy.Node{GPUs: []remedy.GPU{{UUID: "GPU-0", Architecture: "hopper"}, {UUID: "GPU-1", Architecture: "hopper"}}}
	m, _, err := remedy.New(remedy.DefaultPolicy(), node, remedy.Saved{}, t)
	if err != nil {
		panic(err)
	}
	show := func(cmds []remedy.Command) {
		for _, c := range cmds {
			fmt.Println(c)
		}
	}
	show(m.Fault("GPU-0", remedy.Facts{Action: nvml.RecoveryReset}, t))
	show(m.Usage("GPU-0", remedy.Usage{}, t.Add(time.Second)))
	show(m.ResetDone("GPU-0", nil, t.Add(5*time.Second)))
	show(m.ProbeDone("GPU-0", nil, t.Add(20*time.Second)))
	// Output:
	// withhold GPU-0: recovery-action=reset: the driver asks for a GPU reset
	// transition GPU-0 serving->draining: recovery-action=reset: the driver asks for a GPU reset
	// transition GPU-0 draining->resetting: idle; resetting
	// reset GPU-0: recovery-action=reset: the driver asks for a GPU reset
	// transition GPU-0 resetting->probing: probing before it is given back
	// probe GPU-0: recovery-action=reset: the driver asks for a GPU reset
	// giveBack GPU-0 after 20s: proven by the probe
	// transition GPU-0 probing->serving: proven by the probe
}
