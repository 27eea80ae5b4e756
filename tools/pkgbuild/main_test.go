package main

import (
	"testing"
)

func TestNewestGLIBC(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []string
		want string
	}{
		{"numeric order, not string order", []string{"GLIBC_2.3.2", "GLIBC_2.34", "GLIBC_2.4", "GLIBC_2.32"}, "2.34"},
		{"private and other libraries ignored", []string{"GLIBC_PRIVATE", "GCC_3.0", "", "GLIBC_2.2.5"}, "2.2.5"},
		{"static binary", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := NewestGLIBC(tc.in); got != tc.want {
				t.Errorf("NewestGLIBC(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}
