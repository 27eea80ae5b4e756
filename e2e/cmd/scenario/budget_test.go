package main

import "testing"

func TestCheckBudget(t *testing.T) {
	b, _ := rssBudgetMiB("dgx-h100")
	tests := []struct {
		name     string
		profile  string
		rss      float64
		wantNil  bool
		exceeded bool
	}{
		{name: "at the budget", profile: "dgx-h100", rss: b},
		{name: "within the tolerance", profile: "dgx-h100", rss: b * 1.19},
		{name: "past the tolerance", profile: "dgx-h100", rss: b * 1.21, exceeded: true},
		{name: "a profile without a budget", profile: "pcie-4gpu", rss: 1000, wantNil: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := checkBudget(tt.profile, tt.rss)
			if (got == nil) != tt.wantNil {
				t.Fatalf("checkBudget(%s) = %+v, want nil %v", tt.profile, got, tt.wantNil)
			}
			if got != nil && got.Exceeded != tt.exceeded {
				t.Errorf("checkBudget(%s, %.1f).Exceeded = %v, want %v", tt.profile, tt.rss, got.Exceeded, tt.exceeded)
			}
		})
	}
}
