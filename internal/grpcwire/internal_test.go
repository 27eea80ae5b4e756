package grpcwire

import (
	"testing"
	"time"
)

func TestTimeoutRoundTrip(t *testing.T) {
	for _, d := range []time.Duration{time.Nanosecond, 999 * time.Millisecond, 10 * time.Second, 36 * time.Hour, 1<<63 - 1} {
		v := formatTimeout(d)
		if len(v) > 9 {
			t.Errorf("formatTimeout(%v) = %q: more than 8 digits", d, v)
		}
		got, err := parseTimeout(v)
		if err != nil || got < d {
			t.Errorf("parseTimeout(formatTimeout(%v) = %q) = %v, %v; want at least %v", d, v, got, err, d)
		}
	}
	for _, bad := range []string{"", "5", "5x", "-5S", "123456789S"} {
		if _, err := parseTimeout(bad); err == nil {
			t.Errorf("parseTimeout(%q) took it", bad)
		}
	}
}

func TestMessageEncoding(t *testing.T) {
	for _, m := range []string{"", "plain", "100%", "ä\n\t\"x\"", "%zz", "%4"} {
		enc := encodeMessage(m)
		for i := 0; i < len(enc); i++ {
			if c := enc[i]; c < ' ' || c > '~' {
				t.Errorf("encodeMessage(%q) = %q: byte %#x is not printable ASCII", m, enc, c)
			}
		}
		if got := decodeMessage(enc); got != m {
			t.Errorf("decodeMessage(encodeMessage(%q)) = %q", m, got)
		}
	}
	if got := decodeMessage("%zz%4"); got != "%zz%4" {
		t.Errorf("a malformed escape became %q", got)
	}
}
