package scale

import "fmt"

// rssBudgetMiB is the one place the lane's memory budget lives: the peak
// resident set of one plugin process in DRA mode (VmHWM, the mean over
// the fleet, read at the end of the rest) as recorded in
// docs/architecture.md, "Where the memory goes". Lower it with the figure
// when a change makes the plugin smaller; raise it only on purpose, with
// the reason in the commit.
const rssBudgetMiB = 22.7

// rssTolerance is how far above rssBudgetMiB the figure may be before the
// lane fails (issue 44: a regression of more than 20 %).
const rssTolerance = 0.20

// overRSSBudget is the one line the lane fails with when a process's
// peak RSS is more than rssTolerance above rssBudgetMiB; nil otherwise.
func overRSSBudget(perProcessMiB float64) error {
	if perProcessMiB <= rssBudgetMiB*(1+rssTolerance) {
		return nil
	}
	return fmt.Errorf("peak RSS %.1f MiB a plugin process is more than %.0f %% above the budget of %.1f MiB (rssBudgetMiB in e2e/cluster/scale/budget.go; docs/architecture.md says where the memory goes)",
		perProcessMiB, rssTolerance*100, rssBudgetMiB)
}
