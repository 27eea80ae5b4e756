package nvidia

import (
	"strings"
)

// Found is one of NVIDIA's variables set in the environment.
type Found struct {
	Env   string
	Value string
	Key   Key
}

// InEnv lists NVIDIA's variables that are set, as lookup finds them (an
// empty one counts as unset), in the table's order. Where NVIDIA reads a
// setting from two variables, the first set one wins, as in its plugin.
func InEnv(lookup func(string) (string, bool)) []Found {
	var out []Found
	for _, k := range Keys() {
		for _, env := range k.Env {
			if v, ok := lookup(env); ok && v != "" {
				out = append(out, Found{Env: env, Value: v, Key: k})
				break
			}
		}
	}
	return out
}

// Describe says, for the start-up warning, each variable and what to set
// here instead.
func Describe(found []Found) string {
	parts := make([]string, len(found))
	for i, f := range found {
		switch {
		case f.Key.Ours == "":
			parts[i] = f.Env + " → none (" + f.Key.Note + ")"
		case !f.Key.Carried():
			// The counterpart takes another kind of value: say which.
			parts[i] = f.Env + " → " + f.Key.Counterpart() + " (" + f.Key.Note + ")"
		default:
			parts[i] = f.Env + " → " + f.Key.Counterpart()
		}
	}
	return strings.Join(parts, "; ")
}
