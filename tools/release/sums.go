package release

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// folderFiles lists the regular files of a release folder, SHA256SUMS
// aside; the folder has no subfolders.
func folderFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if e.Name() == SumsFile {
			continue
		}
		if !e.Type().IsRegular() {
			return nil, fmt.Errorf("%s is not a regular file: a release folder holds files only", e.Name())
		}
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names, nil
}

// WriteSums writes SHA256SUMS over every other file in dir, in
// sha256sum's text format, so `sha256sum -c SHA256SUMS` checks them.
func WriteSums(dir string) error {
	names, err := folderFiles(dir)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	for _, n := range names {
		sum, err := fileSHA256(filepath.Join(dir, n))
		if err != nil {
			return err
		}
		fmt.Fprintf(&buf, "%s  %s\n", sum, n)
	}
	return writeFile(filepath.Join(dir, SumsFile), func(w io.Writer) error {
		_, err := w.Write(buf.Bytes())
		return err
	})
}

var sumLine = regexp.MustCompile(`^([0-9a-f]{64}) [ *]([^/]+)$`)

// ReadSums reads SHA256SUMS: file name → hex SHA-256.
func ReadSums(dir string) (map[string]string, error) {
	f, err := os.Open(filepath.Join(dir, SumsFile))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sums := map[string]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		m := sumLine.FindStringSubmatch(sc.Text())
		if m == nil {
			return nil, fmt.Errorf("%s line %d: %q is not \"<sha256>  <file>\"", SumsFile, n, sc.Text())
		}
		if _, dup := sums[m[2]]; dup {
			return nil, fmt.Errorf("%s lists %s twice", SumsFile, m[2])
		}
		sums[m[2]] = m[1]
	}
	return sums, sc.Err()
}

// CheckSums checks that SHA256SUMS lists every other file in dir, and
// nothing else, each with its SHA-256.
func CheckSums(dir string) error {
	sums, err := ReadSums(dir)
	if err != nil {
		return err
	}
	names, err := folderFiles(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range names {
		want, ok := sums[n]
		if !ok {
			errs = append(errs, fmt.Errorf("%s is not in %s", n, SumsFile))
			continue
		}
		delete(sums, n)
		got, err := fileSHA256(filepath.Join(dir, n))
		if err != nil {
			errs = append(errs, err)
		} else if got != want {
			errs = append(errs, fmt.Errorf("%s has SHA-256 %s, %s says %s", n, got, SumsFile, want))
		}
	}
	var missing []string
	for n := range sums {
		missing = append(missing, n)
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		errs = append(errs, fmt.Errorf("%s lists files the folder does not have: %s", SumsFile, strings.Join(missing, ", ")))
	}
	return errors.Join(errs...)
}
