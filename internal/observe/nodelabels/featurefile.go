package nodelabels

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/atomicfile"
)

// FileName is our file in NFD's features.d.
const FileName = "gpu-device-plugin"

// expiryDirective is NFD's "drop these labels after" line.
const expiryDirective = "# +expiry-time="

// FeatureFile is NFD's local feature file holding the labels: nfd-worker
// reads every file in its features.d and sets each key=value line as a
// label on its Node.
type FeatureFile struct {
	// Path is the file, <features.d>/gpu-device-plugin.
	Path string
	// Expiry is how long NFD keeps the labels once we stop rewriting the
	// file, so an uninstalled plugin's labels go; 0 keeps them forever.
	// Sync rewrites the file when less than half of it is left.
	Expiry time.Duration
}

// Sync writes labels unless the file already holds exactly them with more
// than half its expiry left; nothing changes at rest but that refresh.
// It says whether it wrote.
func (f FeatureFile) Sync(labels map[string]string, now time.Time) (bool, error) {
	old, expires, err := read(f.Path)
	fresh := f.Expiry == 0 && expires.IsZero() || f.Expiry > 0 && expires.Sub(now) > f.Expiry/2
	if err == nil && fresh && maps.Equal(old, labels) {
		return false, nil
	}
	var b bytes.Buffer
	b.WriteString("# The GPUs' labels, in GPU Feature Discovery's names, written by gpu-device-plugin.\n")
	if f.Expiry > 0 {
		fmt.Fprintf(&b, "%s%s\n", expiryDirective, now.Add(f.Expiry).UTC().Format(time.RFC3339))
	}
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		fmt.Fprintf(&b, "%s=%s\n", k, labels[k])
	}
	if _, err := atomicfile.Write(f.Path, b.Bytes(), atomicfile.Options{Mode: 0o644}); err != nil {
		return false, fmt.Errorf("writing NFD's feature file: %w", err)
	}
	return true, nil
}

// Remove deletes the file, so NFD drops the labels at its next pass.
func (f FeatureFile) Remove() error {
	if err := os.Remove(f.Path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing NFD's feature file: %w", err)
	}
	return nil
}

// read parses a feature file: its labels and expiry (zero without one).
func read(path string) (map[string]string, time.Time, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, time.Time{}, err
	}
	labels := map[string]string{}
	var expires time.Time
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if v, ok := strings.CutPrefix(line, expiryDirective); ok {
			if expires, err = time.Parse(time.RFC3339, v); err != nil {
				return nil, time.Time{}, fmt.Errorf("%s: expiry %q: %w", path, v, err)
			}
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, _ := strings.Cut(line, "=")
		labels[k] = v
	}
	return labels, expires, sc.Err()
}
