package deviceplugin

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// dirOp is what happened to a name in the watched directory.
type dirOp uint8

const (
	// created: a file was created in, or renamed into, the directory.
	created dirOp = iota + 1
	// removed: a file was removed from, or renamed out of, the directory.
	removed
)

// dirEvent is one change in the watched directory; name is the full path.
type dirEvent struct {
	name string
	op   dirOp
}

// errEventOverflow says the kernel dropped events: the caller should look
// at the directory rather than trust the events it got.
var errEventOverflow = errors.New("inotify queue overflowed: events were lost")

// dirWatchBuffer holds many events at once; the kernel keeps the rest
// queued for the next read. It must hold one event with the longest name.
const dirWatchBuffer = 4096

// dirWatch reports files created in and removed from one directory, read
// from inotify by one goroutine into a buffer on the heap. fsnotify's
// reader keeps a 64 KiB array on its goroutine's stack instead: the stack
// grows to 256 KiB, and since the runtime sizes new goroutines' stacks by
// the average it scans, every goroutine then starts at 8 KiB, not 2.
type dirWatch struct {
	f      *os.File
	dir    string
	buf    []byte // on the heap: a local array would be on the goroutine's stack
	events chan dirEvent
	errs   chan error
	done   chan struct{}
	close  sync.Once
	ended  chan struct{}
}

// watchDir starts watching dir. Close ends the watch and its goroutine;
// events then closes.
func watchDir(dir string) (*dirWatch, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("inotify_init1: %w", err)
	}
	// Non-blocking, the descriptor is read through the runtime's poller,
	// so Close wakes a pending read.
	f := os.NewFile(uintptr(fd), "inotify")
	const mask = unix.IN_CREATE | unix.IN_MOVED_TO | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_ONLYDIR
	if _, err := unix.InotifyAddWatch(fd, dir, mask); err != nil {
		f.Close()
		return nil, fmt.Errorf("inotify_add_watch %s: %w", dir, err)
	}
	w := &dirWatch{
		f:      f,
		dir:    dir,
		buf:    make([]byte, dirWatchBuffer),
		events: make(chan dirEvent),
		errs:   make(chan error),
		done:   make(chan struct{}),
		ended:  make(chan struct{}),
	}
	go w.read()
	return w, nil
}

// Events yields the directory's changes in order; it is closed when the
// watch ends.
func (w *dirWatch) Events() <-chan dirEvent { return w.events }

// Errors yields errEventOverflow, and the read error that ends the watch.
func (w *dirWatch) Errors() <-chan error { return w.errs }

// Close ends the watch and waits for its goroutine.
func (w *dirWatch) Close() error {
	var err error
	w.close.Do(func() {
		close(w.done)
		err = w.f.Close()
	})
	<-w.ended
	return err
}

func (w *dirWatch) read() {
	defer close(w.ended)
	defer close(w.events)
	buf := w.buf
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				w.sendErr(fmt.Errorf("reading inotify events for %s: %w", w.dir, err))
			}
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			mask := binary.NativeEndian.Uint32(buf[off+4:])
			end := off + unix.SizeofInotifyEvent + int(binary.NativeEndian.Uint32(buf[off+12:]))
			if end > n { // the kernel never splits an event; do not trust it to
				break
			}
			name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:end]), "\x00")
			off = end
			if mask&unix.IN_Q_OVERFLOW != 0 {
				if !w.sendErr(errEventOverflow) {
					return
				}
				continue
			}
			var op dirOp
			switch {
			case mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
				op = created
			case mask&(unix.IN_DELETE|unix.IN_MOVED_FROM) != 0:
				op = removed
			default: // IN_IGNORED and the like: nothing for a caller
				continue
			}
			select {
			case w.events <- dirEvent{name: filepath.Join(w.dir, name), op: op}:
			case <-w.done:
				return
			}
		}
	}
}

func (w *dirWatch) sendErr(err error) bool {
	select {
	case w.errs <- err:
		return true
	case <-w.done:
		return false
	}
}
