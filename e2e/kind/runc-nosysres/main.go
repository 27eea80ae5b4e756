// Command runc-nosysres is runc for the kind e2e's own Docker daemon on
// machines whose bounding set lacks CAP_SYS_RESOURCE (some sandboxed VMs):
// kind's nodes are privileged, and runc fails to start a container, or exec
// a process in one, that asks for a capability it cannot have. It drops
// that one capability from the bundle's config.json (create, run) or the
// process file (exec), then execs the runc on PATH with the same arguments.
// Everything else in the file is kept as it was, numbers exactly (an
// unlimited rlimit is 2^64-1, which a float would round).
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

const dropped = "CAP_SYS_RESOURCE"

func main() {
	args := os.Args[1:]
	if err := dropCapability(args); err != nil {
		fmt.Fprintln(os.Stderr, "runc-nosysres:", err)
		os.Exit(1)
	}
	runc, err := exec.LookPath("runc")
	if err != nil {
		fmt.Fprintln(os.Stderr, "runc-nosysres:", err)
		os.Exit(1)
	}
	if err := syscall.Exec(runc, append([]string{"runc"}, args...), os.Environ()); err != nil {
		fmt.Fprintf(os.Stderr, "runc-nosysres: exec %s: %v\n", runc, err)
		os.Exit(1)
	}
}

// dropCapability edits the file runc is about to read for args, if any.
func dropCapability(args []string) error {
	file, path := target(args)
	if file == "" {
		return nil
	}
	if err := editCapabilities(file, path...); err != nil {
		return fmt.Errorf("dropping %s from %s: %w", dropped, file, err)
	}
	return nil
}

// target is the JSON file runc reads the new process from, and where in it
// the capabilities are: create and run read the bundle's config.json
// (--bundle, -b, else the working directory), exec its --process file.
// Other commands start nothing.
func target(args []string) (file string, path []string) {
	cmd, bundle, process := "", ".", ""
	for i := 0; i < len(args); i++ {
		a := args[i]
		value := func() string {
			if i+1 < len(args) {
				i++
				return args[i]
			}
			return ""
		}
		switch {
		case a == "--bundle" || a == "-b":
			bundle = value()
		case strings.HasPrefix(a, "--bundle="):
			bundle = strings.TrimPrefix(a, "--bundle=")
		case a == "--process" || a == "-p":
			process = value()
		case strings.HasPrefix(a, "--process="):
			process = strings.TrimPrefix(a, "--process=")
		case cmd == "" && (a == "create" || a == "run" || a == "exec"):
			cmd = a
		}
	}
	switch {
	case cmd == "create" || cmd == "run":
		return filepath.Join(bundle, "config.json"), []string{"process", "capabilities"}
	case cmd == "exec" && process != "":
		return process, []string{"capabilities"}
	}
	return "", nil
}

// editCapabilities removes the capability from every set under path in
// file, rewriting the file (same mode) only when something was removed.
func editCapabilities(file string, path ...string) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var doc map[string]any
	if err := dec.Decode(&doc); err != nil {
		return err
	}
	node := doc
	for _, k := range path {
		next, ok := node[k].(map[string]any)
		if !ok {
			return nil // no capabilities: runc keeps its defaults
		}
		node = next
	}
	changed := false
	for set, v := range node {
		list, ok := v.([]any)
		if !ok {
			continue
		}
		kept := slices.DeleteFunc(slices.Clone(list), func(c any) bool { return c == dropped })
		if len(kept) != len(list) {
			node[set] = kept
			changed = true
		}
	}
	if !changed {
		return nil
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(doc); err != nil {
		return err
	}
	info, err := os.Stat(file)
	if err != nil {
		return err
	}
	tmp := file + ".nosysres"
	if err := os.WriteFile(tmp, out.Bytes(), info.Mode().Perm()); err != nil {
		return err
	}
	if err := os.Chmod(tmp, info.Mode().Perm()); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, file)
}
