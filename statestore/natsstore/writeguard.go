package natsstore

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go"
)

// writeRefusals is what the store's writes ask about the streams they
// write to: the embedded server (Embedded) answers, from what its Check
// last found.
type writeRefusals interface {
	// refused returns what was last found about stream (nil: no write
	// error), without asking the server: it is asked before every write.
	refused(stream string) *WriteRefusedError
	// recheck asks the server now, keeps what it finds for refused, and
	// returns what it found about stream. It is asked after a write the
	// server did not answer.
	recheck(stream string) *WriteRefusedError
}

// writeGuard fails the writes to one stream fast while the embedded
// server reports a write error of that stream. A stream whose file store
// failed a write refuses every later write until the server restarts, and
// the server answers none of them: without the guard each would wait out
// its timeout. The zero writeGuard (a connection to an external server)
// lets every write through.
type writeGuard struct {
	src    writeRefusals
	stream string
}

// guardOf is the guard of stream for writes on nc. Only a connection that
// Embedded.Connect made carries the embedded server (as its in-process
// connection provider, which is Embedded itself); for any other the guard
// lets every write through.
func guardOf(nc *nats.Conn, stream string) writeGuard {
	if nc == nil {
		return writeGuard{}
	}
	src, _ := nc.Opts.InProcessServer.(writeRefusals)
	return writeGuard{src: src, stream: stream}
}

// before returns the stream's write error, as last found, or nil: one
// atomic load and a map lookup, no request.
func (g writeGuard) before() error {
	if g.src == nil {
		return nil
	}
	if r := g.src.refused(g.stream); r != nil {
		return r
	}
	return nil
}

// after returns err of a write, or, when the server did not answer it and
// now reports a write error of the stream, that error with err in its
// tree. It asks the server only after a write that got no answer.
func (g writeGuard) after(err error) error {
	if err == nil || g.src == nil || !noAnswer(err) {
		return err
	}
	if r := g.src.recheck(g.stream); r != nil {
		r.Err = err
		return r
	}
	return err
}

// noAnswer reports whether err says a request got no answer in time.
func noAnswer(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
}
