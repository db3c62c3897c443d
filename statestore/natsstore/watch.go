package natsstore

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

// Watch watches keys in kv (jetstream.AllKeys for every key) as
// kv.Watch does, through a watch that outlives a stalled consumer: an
// ordered consumer the server keeps alive but that delivers nothing, with
// no error and no reset (an overloaded server left one so for good under
// a steady load; TestWatch_AStalledConsumer causes it with the consumer
// paused on the server). When the watch has delivered nothing for
// stallAfter, it asks the bucket's stream for its last sequence (one
// stream info at most every stallAfter while idle); if the bucket holds a
// revision past the last one delivered, it stops its watcher and watches
// anew from the revision after it. Nothing is delivered twice: an entry
// at or below the last revision delivered is dropped, and the nil marker
// (the initial values are in) is delivered once, by whichever watcher
// reaches it first. The bucket's last sequence counts every key, so a
// watch of some keys may reopen once for a revision of another key; it
// does not reopen again for the same last sequence.
func Watch(ctx context.Context, kv jetstream.KeyValue, keys string, log *zap.Logger, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	inner, err := kv.Watch(ctx, keys, opts...)
	if err != nil {
		return nil, err
	}
	w := &watch{kv: kv, keys: keys, opts: opts, log: log, out: make(chan jetstream.KeyValueEntry), stop: make(chan struct{})}
	go w.run(ctx, inner)
	return w, nil
}

// watch is the jetstream.KeyWatcher Watch returns.
type watch struct {
	kv   jetstream.KeyValue
	keys string
	opts []jetstream.WatchOpt
	log  *zap.Logger
	out  chan jetstream.KeyValueEntry
	stop chan struct{}
	once sync.Once
}

// Updates implements jetstream.KeyWatcher; the channel is closed when the
// watch ends (Stop, its context done, or its watcher ended).
func (w *watch) Updates() <-chan jetstream.KeyValueEntry { return w.out }

// Stop implements jetstream.KeyWatcher.
func (w *watch) Stop() error {
	w.once.Do(func() { close(w.stop) })
	return nil
}

// run forwards inner's updates to out and replaces inner when it stalls.
func (w *watch) run(ctx context.Context, inner jetstream.KeyWatcher) {
	defer close(w.out)
	defer func() { release(inner) }()
	var (
		last        uint64 // the last revision delivered
		marked      bool   // the nil marker was delivered
		reopenedFor uint64 // the bucket's last sequence at the last reopen
		progress    = time.Now()
		checked     time.Time
	)
	tick := time.NewTicker(stallAfter / 4)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.stop:
			return
		case e, ok := <-inner.Updates():
			if !ok {
				return
			}
			progress = time.Now()
			if e == nil {
				if marked {
					continue
				}
				marked = true
			} else {
				if e.Revision() <= last {
					continue
				}
				last = e.Revision()
			}
			select {
			case w.out <- e:
				progress = time.Now() // a slow reader is not a stalled consumer
			case <-ctx.Done():
				return
			case <-w.stop:
				return
			}
		case now := <-tick.C:
			if now.Sub(progress) < stallAfter || now.Sub(checked) < stallAfter || len(inner.Updates()) > 0 {
				continue // delivering, asked lately, or entries waiting
			}
			checked = now
			bucketLast, err := w.lastSeq(ctx)
			if err != nil || bucketLast <= last || bucketLast == reopenedFor {
				continue // nothing to read, or the next tick asks again
			}
			w.log.Warn("kv watch: the bucket's consumer delivered nothing for a while though the bucket holds revisions past it; watching anew",
				zap.String("keys", w.keys), zap.Uint64("through", last), zap.Uint64("bucketLast", bucketLast), zap.Duration("idle", now.Sub(progress)))
			opts := w.opts
			if last > 0 {
				opts = append(append([]jetstream.WatchOpt{}, w.opts...), jetstream.ResumeFromRevision(last+1))
			}
			nw, err := w.kv.Watch(ctx, w.keys, opts...)
			if err != nil {
				w.log.Warn("kv watch: cannot watch anew; keeping the watch it has", zap.String("keys", w.keys), zap.Error(err))
				continue
			}
			release(inner)
			inner, progress, reopenedFor = nw, now, bucketLast
		}
	}
}

// lastSeq is the last sequence of the bucket's stream (stream info).
func (w *watch) lastSeq(ctx context.Context) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	st, err := w.kv.Status(ctx)
	if err != nil {
		return 0, err
	}
	bs, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok {
		return 0, nil
	}
	return bs.StreamInfo().State.LastSeq, nil
}

// release stops kw and drains its channel until it closes: the client
// delivers an update while holding the lock that closing the channel
// needs, so a watcher nobody reads would never finish stopping.
func release(kw jetstream.KeyWatcher) {
	_ = kw.Stop()
	go func() {
		for range kw.Updates() {
		}
	}()
}
