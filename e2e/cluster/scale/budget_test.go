package scale

import "testing"

func TestOverRSSBudget(t *testing.T) {
	limit := rssBudgetMiB * (1 + rssTolerance)
	for _, tt := range []struct {
		name string
		mib  float64
		over bool
	}{
		{name: "the budget itself passes", mib: rssBudgetMiB},
		{name: "just under the tolerance passes", mib: limit - 0.01},
		{name: "at the tolerance passes", mib: limit},
		{name: "above the tolerance fails", mib: limit + 0.1, over: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := overRSSBudget(tt.mib); (err != nil) != tt.over {
				t.Errorf("overRSSBudget(%.2f) = %v, want over=%v", tt.mib, err, tt.over)
			}
		})
	}
}
