// Package logtest is a log sink for tests: what a component logged, read
// while it may still be writing.
package logtest

import (
	"bytes"
	"sync"
)

// Buffer is an io.Writer safe for concurrent writes and reads; its zero
// value is ready for use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String is everything written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
