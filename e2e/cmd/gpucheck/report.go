package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Report is gpu-check's answer, written as report.json. Its keys are
// documented in docs/gpu-check.md.
type Report struct {
	// Passed is true when no check of any step failed.
	Passed bool `json:"passed"`
	// Mock is true on a fixture's mock node: the CUDA probe then loads the
	// fixture's stand-in libcuda, not CUDA.
	Mock    bool      `json:"mock"`
	Started time.Time `json:"started"`
	Seconds float64   `json:"seconds"`
	Node    NodeFacts `json:"node"`
	Steps   []*Step   `json:"steps"`
}

// NodeFacts is what the machine is, as far as it matters here.
type NodeFacts struct {
	Hostname   string `json:"hostname"`
	Kernel     string `json:"kernel"`
	OS         string `json:"os"`
	DriverRoot string `json:"driverRoot"`
	Runc       string `json:"runc"`
	Plugin     string `json:"pluginVersion"`
}

// Step is one of the numbered parts of the check.
type Step struct {
	Name    string  `json:"name"`
	Status  string  `json:"status"` // pass, fail or skip
	Seconds float64 `json:"seconds"`
	// Skipped says why a step did not run.
	Skipped string  `json:"skipped,omitempty"`
	Checks  []Check `json:"checks"`
	// Data is what the step measured or read, for the reader.
	Data any `json:"data,omitempty"`
	// Notes are a few lines of what Data holds that the summary prints
	// under the step.
	Notes []string `json:"notes,omitempty"`
}

// Check is one pass/fail judgement.
type Check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail,omitempty"`
}

// check records a judgement and returns ok.
func (s *Step) check(name string, ok bool, detail string, args ...any) bool {
	if len(args) > 0 {
		detail = fmt.Sprintf(detail, args...)
	}
	s.Checks = append(s.Checks, Check{Name: name, OK: ok, Detail: detail})
	return ok
}

// fail records a failed check whose cause is err.
func (s *Step) fail(name string, err error) { s.check(name, false, "%v", err) }

// finish sets the status from the checks.
func (s *Step) finish(began time.Time) {
	s.Seconds = roundSeconds(time.Since(began))
	switch {
	case s.Skipped != "":
		s.Status = "skip"
	case len(s.Checks) == 0:
		s.Status = "fail"
		s.Checks = append(s.Checks, Check{Name: "ran", Detail: "the step made no check"})
	default:
		s.Status = "pass"
		for _, c := range s.Checks {
			if !c.OK {
				s.Status = "fail"
			}
		}
	}
}

// errText is err's text, or "" for nil.
func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func roundSeconds(d time.Duration) float64 { return float64(d.Milliseconds()) / 1000 }

// write saves report.json and summary.txt in dir.
func (r *Report) write(dir string, summary string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "report.json"), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "summary.txt"), []byte(summary), 0o644); err != nil {
		return fmt.Errorf("writing the summary: %w", err)
	}
	return nil
}

// summary is the short text: one line per step, one per failed check.
func (r *Report) summary() string {
	var b strings.Builder
	verdict := "PASSED"
	if !r.Passed {
		verdict = "FAILED"
	}
	what := "a GPU node"
	if r.Mock {
		what = "the MOCK node (fixture; CUDA probe is the stand-in libcuda, not CUDA)"
	}
	fmt.Fprintf(&b, "gpu-check %s on %s in %.0fs\n", verdict, what, r.Seconds)
	fmt.Fprintf(&b, "node: %s, kernel %s, %s, driver root %s, plugin %s\n", r.Node.Hostname, r.Node.Kernel, r.Node.OS, r.Node.DriverRoot, r.Node.Plugin)
	for i, s := range r.Steps {
		ok := 0
		for _, c := range s.Checks {
			if c.OK {
				ok++
			}
		}
		line := fmt.Sprintf("%d. %-11s %-4s %3d/%-3d checks  %6.1fs", i+1, s.Name, s.Status, ok, len(s.Checks), s.Seconds)
		if s.Skipped != "" {
			line += "  (" + s.Skipped + ")"
		}
		fmt.Fprintln(&b, strings.TrimRight(line, " "))
		for _, n := range s.Notes {
			fmt.Fprintf(&b, "   %s\n", n)
		}
		for _, c := range s.Checks {
			if !c.OK {
				fmt.Fprintf(&b, "   FAIL %s: %s\n", c.Name, oneLine(c.Detail, 400))
			}
		}
	}
	return b.String()
}

func oneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > max {
		s = s[:max] + "..."
	}
	return s
}

// progress tells the person waiting what runs now.
func progress(w io.Writer, format string, args ...any) {
	fmt.Fprintf(w, "gpu-check: "+format+"\n", args...)
}
