package release

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
)

// errStripped says a binary has no symbol table to name main.version by.
var errStripped = errors.New("no symbol table")

// StampedVersion is the string main.version holds in a Go ELF binary: what
// make stamps with -X main.version and the binary reports. Build
// information does not say it (go build leaves -ldflags out of it under
// -trimpath), so it is read from the data: through the symbol table, or,
// in a binary stripped of it (-s, as the dp and DRA executables are), by
// finding a string variable that holds exactly want. The latter returns
// want or errStripped.
func StampedVersion(content []byte, want string) (string, error) {
	f, err := elf.NewFile(bytes.NewReader(content))
	if err != nil {
		return "", err
	}
	if f.Class != elf.ELFCLASS64 {
		return "", fmt.Errorf("a %s binary: only 64-bit ones are read", f.Class)
	}
	syms, err := f.Symbols()
	if err == nil {
		for _, s := range syms {
			if s.Name == "main.version" {
				return readString(f, s.Value)
			}
		}
		return "", errors.New("no main.version variable")
	}
	if !errors.Is(err, elf.ErrNoSymbols) {
		return "", err
	}
	if holdsString(f, want) {
		return want, nil
	}
	return "", errStripped
}

// readString reads the Go string header at addr, then its bytes.
func readString(f *elf.File, addr uint64) (string, error) {
	hdr, err := readAt(f, addr, 16)
	if err != nil {
		return "", fmt.Errorf("main.version: %w", err)
	}
	ptr, n := f.ByteOrder.Uint64(hdr), f.ByteOrder.Uint64(hdr[8:])
	if n == 0 {
		return "", nil
	}
	if n > 1<<10 {
		return "", fmt.Errorf("main.version: a %d-byte string", n)
	}
	b, err := readAt(f, ptr, n)
	if err != nil {
		return "", fmt.Errorf("main.version's bytes: %w", err)
	}
	return string(b), nil
}

func readAt(f *elf.File, addr, n uint64) ([]byte, error) {
	for _, s := range f.Sections {
		if s.Flags&elf.SHF_ALLOC == 0 || addr < s.Addr || addr+n > s.Addr+s.Size {
			continue
		}
		if s.Type == elf.SHT_NOBITS {
			return make([]byte, n), nil
		}
		b := make([]byte, n)
		if _, err := s.ReadAt(b, int64(addr-s.Addr)); err != nil {
			return nil, err
		}
		return b, nil
	}
	return nil, fmt.Errorf("address %#x is in no section", addr)
}

// holdsString says whether a data section holds a Go string header
// pointing at s's bytes in a read-only section.
func holdsString(f *elf.File, s string) bool {
	if s == "" {
		return false
	}
	var headers [][]byte
	for _, sec := range f.Sections {
		if sec.Type != elf.SHT_PROGBITS || sec.Flags&elf.SHF_ALLOC == 0 || sec.Flags&(elf.SHF_WRITE|elf.SHF_EXECINSTR) != 0 {
			continue
		}
		data, err := sec.Data()
		if err != nil {
			continue
		}
		for off := 0; ; {
			i := bytes.Index(data[off:], []byte(s))
			if i < 0 {
				break
			}
			h := make([]byte, 16)
			f.ByteOrder.PutUint64(h, sec.Addr+uint64(off+i))
			f.ByteOrder.PutUint64(h[8:], uint64(len(s)))
			headers = append(headers, h)
			off += i + 1
		}
	}
	for _, sec := range f.Sections {
		if sec.Type != elf.SHT_PROGBITS || sec.Flags&elf.SHF_WRITE == 0 {
			continue
		}
		data, err := sec.Data()
		if err != nil {
			continue
		}
		for _, h := range headers {
			for off := 0; ; {
				i := bytes.Index(data[off:], h)
				if i < 0 {
					break
				}
				if (off+i)%8 == 0 {
					return true
				}
				off += i + 1
			}
		}
	}
	return false
}
