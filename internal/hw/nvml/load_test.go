package nvml

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestLoadNamesTheCause: when NVML cannot be loaded, the error says which
// setting points where, and what is wrong there.
func TestLoadNamesTheCause(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "text.so")
	if err := os.WriteFile(text, []byte("not a library"), 0o644); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable() // an ELF file of this machine's architecture
	if err != nil {
		t.Fatal(err)
	}
	emptyRoot := t.TempDir()
	withLib := t.TempDir()
	lib := filepath.Join(withLib, LibraryDirs(runtime.GOARCH)[0], libraryName)
	if err := os.MkdirAll(filepath.Dir(lib), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lib, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	failing := func(path string) (Library, error) {
		return nil, errors.Join(ErrNoDriver, errors.New("dlopen "+path+" failed"))
	}
	for _, tc := range []struct {
		name, driverRoot, explicit, want string
	}{
		{"missing library", "/", filepath.Join(dir, "nope.so"), `nvmlLibrary (--nvml-library) "` + dir + `/nope.so" does not exist`},
		{"library is a directory", "/", dir, `nvmlLibrary (--nvml-library) "` + dir + `" is a directory; give the library file`},
		{"library is not ELF", "/", text, `nvmlLibrary (--nvml-library) "` + text + `" is not a shared library`},
		{"missing driver root", "/nonexistent-driver-root", "", `driverRoot (--driver-root) "/nonexistent-driver-root" does not exist`},
		{"driver root without the library", emptyRoot, "", `no libnvidia-ml.so.1 under driverRoot (--driver-root) "` + emptyRoot + `"`},
		// Nothing seen wrong: the loader's own failure stands.
		{"ELF library the loader refuses", "/", self, "dlopen " + self + " failed"},
		{"driver root with the library", withLib, "", "dlopen " + lib + " failed"},
		{"the loader's search", "/", "", "dlopen libnvidia-ml.so.1 failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := Load(failing, tc.driverRoot, tc.explicit)
			if !errors.Is(err, ErrNoDriver) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want ErrNoDriver saying %q", err, tc.want)
			}
		})
	}
}
