package ocihook

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseLink(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     Link
		err      string
	}{
		{name: "bare target", in: "libcuda.so.1::/usr/lib64/libcuda.so", want: Link{"libcuda.so.1", "/usr/lib64/libcuda.so"}},
		{name: "link path cleaned", in: "libcuda.so.1::/usr/lib64//x/../libcuda.so", want: Link{"libcuda.so.1", "/usr/lib64/libcuda.so"}},
		{name: "target kept verbatim", in: "../lib/libcuda.so.1::/usr/lib64/libcuda.so", want: Link{"../lib/libcuda.so.1", "/usr/lib64/libcuda.so"}},
		{name: "no separator", in: "libcuda.so.1:/usr/lib64/libcuda.so", err: "is not TARGET::LINK"},
		{name: "empty target", in: "::/usr/lib64/libcuda.so", err: "TARGET must be"},
		{name: "relative link", in: "libcuda.so.1::usr/lib64/libcuda.so", err: "LINK must be an absolute path"},
		{name: "root link", in: "libcuda.so.1::/", err: "not /"},
		{name: "control character", in: "libcuda.so.1::/usr/lib64/libcuda.so\n", err: "control characters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseLink(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("ParseLink(%q) error = %v, want one containing %q", tc.in, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseLink(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestParseFolder(t *testing.T) {
	for _, tc := range []struct{ name, in, want, err string }{
		{name: "absolute", in: "/usr/lib/x86_64-linux-gnu", want: "/usr/lib/x86_64-linux-gnu"},
		{name: "cleaned", in: "/usr/lib64/", want: "/usr/lib64"},
		{name: "relative", in: "usr/lib64", err: "absolute path"},
		{name: "newline would add a line to ld.so.conf", in: "/usr/lib64\ninclude /x", err: "control characters"},
		{name: "space", in: "/usr/lib 64", err: "cannot contain"},
		{name: "comment", in: "/usr/lib#64", err: "cannot contain"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseFolder(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("ParseFolder(%q) error = %v, want one containing %q", tc.in, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseFolder(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestRequestArgsRoundTrip(t *testing.T) {
	req := Request{
		Links:   []Link{{"libcuda.so.1", "/usr/lib64/libcuda.so"}, {"libnvidia-ml.so.1", "/usr/lib64/libnvidia-ml.so"}},
		Folders: []string{"/usr/lib64", "/opt/nvidia/lib"},
	}
	var got Request
	args := req.Args()
	for i := 0; i < len(args); i += 2 {
		switch args[i] {
		case "--link":
			l, err := ParseLink(args[i+1])
			if err != nil {
				t.Fatal(err)
			}
			got.Links = append(got.Links, l)
		case "--folder":
			f, err := ParseFolder(args[i+1])
			if err != nil {
				t.Fatal(err)
			}
			got.Folders = append(got.Folders, f)
		}
	}
	if !reflect.DeepEqual(got, req) {
		t.Fatalf("parsed %+v back from %q, want %+v", got, args, req)
	}
}

func TestLimitWriter(t *testing.T) {
	var b strings.Builder
	w := &limitWriter{w: &b, n: 5}
	for _, s := range []string{"abc", "defg", "hij"} {
		if n, err := w.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v; want %d, nil so the writer keeps draining", s, n, err, len(s))
		}
	}
	if got := b.String(); !strings.HasPrefix(got, "abcde\n") || strings.Count(got, "dropped") != 1 {
		t.Fatalf("got %q, want the first 5 bytes and one note", got)
	}
}
