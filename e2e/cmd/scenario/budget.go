package main

import "fmt"

// rssTolerance is how far above its budget a profile's RSS after idle may
// be before the scenario fails (issue 44: a regression of more than 20 %).
const rssTolerance = 0.20

// rssBudgetMiB is the one place the memory budgets live: each profile's
// resident set after idle (Process.RSSAfterIdleMiB) as recorded in
// docs/architecture.md, "Where the memory goes". Lower it with the figure
// when a change makes the plugin smaller; raise it only on purpose, with
// the reason in the commit. A profile without one is not checked.
func rssBudgetMiB(profile string) (float64, bool) {
	switch profile {
	case "dgx-h100":
		return 18.7, true
	case "hgx-16":
		return 18.6, true
	}
	return 0, false
}

// Budget is the report's check of RSS after idle against rssBudgetMiB.
type Budget struct {
	RSSAfterIdleMiB float64 `json:"rssAfterIdleMiB"`
	Tolerance       float64 `json:"tolerance"`
	Exceeded        bool    `json:"exceeded"`
}

// checkBudget compares rssMiB with profile's budget; nil when the profile
// has none.
func checkBudget(profile string, rssMiB float64) *Budget {
	b, ok := rssBudgetMiB(profile)
	if !ok {
		return nil
	}
	return &Budget{RSSAfterIdleMiB: b, Tolerance: rssTolerance, Exceeded: rssMiB > b*(1+rssTolerance)}
}

// overBudget is the one line the scenario fails with.
func overBudget(profile string, rssMiB float64, b *Budget) error {
	return fmt.Errorf("profile %s: RSS after idle %.1f MiB is more than %.0f %% above its budget of %.1f MiB (rssBudgetMiB in e2e/cmd/scenario/budget.go; docs/architecture.md says where the memory goes)",
		profile, rssMiB, b.Tolerance*100, b.RSSAfterIdleMiB)
}
