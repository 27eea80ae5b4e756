package sysfs

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// RDMAPort is one port of an RDMA device, as
// <dev>/infiniband/<ibdev>/ports/<n> shows it. This, not the IPoIB or
// Ethernet netdev, is what verbs users (NCCL, UCX) depend on.
type RDMAPort struct {
	Device string // "mlx5_0"
	Port   string // "1"
	// State is the logical state's name ("ACTIVE", "DOWN", "INIT",
	// "ARMED"); empty when it could not be read or parsed.
	State string
	// PhysState is the physical state's name ("LinkUp", "Polling",
	// "Disabled"); empty when it could not be read or parsed.
	PhysState string
	// LinkLayer is "InfiniBand" or "Ethernet" (RoCE).
	LinkLayer string
}

// Active reports whether the port can carry traffic: logical state
// ACTIVE (or ACTIVE_DEFER) and, when known, physical state LinkUp.
func (p RDMAPort) Active() bool {
	return (p.State == "ACTIVE" || p.State == "ACTIVE_DEFER") && (p.PhysState == "" || p.PhysState == "LinkUp")
}

// rdmaPorts reads every port of one RDMA device. state and phys_state read
// "4: ACTIVE" and "5: LinkUp"; an unreadable or garbled one leaves that
// field empty (not judged) and is returned as an error to note.
func rdmaPorts(ibdev, name string) ([]RDMAPort, []error) {
	var ports []RDMAPort
	var errs []error
	names := dirNames(filepath.Join(ibdev, "ports"))
	slices.SortFunc(names, func(a, b string) int {
		x, _ := strconv.Atoi(a)
		y, _ := strconv.Atoi(b)
		return cmp.Or(cmp.Compare(x, y), cmp.Compare(a, b))
	})
	for _, port := range names {
		dir := filepath.Join(ibdev, "ports", port)
		p := RDMAPort{Device: name, Port: port, LinkLayer: readTrimmed(filepath.Join(dir, "link_layer"))}
		var err error
		if p.State, err = portState(dir, "state"); err != nil {
			errs = append(errs, fmt.Errorf("RDMA port %s/%s: %w; its state is not judged", name, port, err))
		}
		if p.PhysState, err = portState(dir, "phys_state"); err != nil {
			errs = append(errs, fmt.Errorf("RDMA port %s/%s: %w; its physical state is not judged", name, port, err))
		}
		ports = append(ports, p)
	}
	return ports, errs
}

// portState reads "<number>: <NAME>" and returns NAME; empty, without an
// error, when the file is missing.
func portState(dir, file string) (string, error) {
	path := filepath.Join(dir, file)
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", nil
		}
		return "", fmt.Errorf("reading %s: %w", path, err)
	}
	s := strings.TrimSpace(string(b))
	num, name, ok := strings.Cut(s, ":")
	name = strings.TrimSpace(name)
	if _, err := strconv.Atoi(strings.TrimSpace(num)); !ok || err != nil || name == "" {
		return "", fmt.Errorf("reading %s: %q is not \"<number>: <state>\" (example: \"4: ACTIVE\"): %w", path, s, ErrMalformed)
	}
	return name, nil
}

func portLinkType(ibdev string) string {
	for _, port := range dirNames(filepath.Join(ibdev, "ports")) {
		switch strings.ToLower(readTrimmed(filepath.Join(ibdev, "ports", port, "link_layer"))) {
		case "infiniband":
			return LinkInfiniBand
		case "ethernet":
			return LinkEther
		}
	}
	return ""
}
