// Package membership shares per-run background work between the sidecar
// replicas that use one NATS: each replica keeps a key alive in a KV bucket
// (a heartbeat, a lease that lapses when it stops), watches the bucket for
// the others, and owns the runs that rendezvous hashing gives it among the
// live replicas. When a replica leaves (Close deletes its key) its runs
// move to the others at once; when one dies they move once its heartbeat
// is DeadAfter old. Only the dead replica's runs move, never the others'.
//
// Ownership only divides work that every replica could do; it never guards
// correctness (appends are idempotent, index writes compare-and-set). So
// when a replica cannot tell who is alive — its watch has not caught up,
// or its own heartbeat is failing and the others may have written it off —
// it owns every run: work is done twice for a while rather than not at all. A replica that just started
// counts only the heartbeats it sees arrive, so a dead member's key still in
// the bucket is never taken for a live one; for its first Heartbeat it sees
// few others and owns their runs too.
package membership

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

// DefaultBucket is the KV bucket of the members' heartbeats.
const DefaultBucket = "SIDECAR_MEMBERS"

// Options configures Open. Zero values take the defaults noted.
type Options struct {
	// Bucket (default DefaultBucket).
	Bucket string
	// Name is this replica's name in the members' values and the logs
	// (its worker id); the key itself is random, so two replicas given
	// the same name are still two members.
	Name string
	// Heartbeat is the period of the member's heartbeat (default 2s).
	Heartbeat time.Duration
	// DeadAfter is how long after its last heartbeat a member is taken
	// for dead and its runs move to the others (default 5 x Heartbeat).
	DeadAfter time.Duration
	// Replicas of the bucket when Open creates it (default 1).
	Replicas int
	// Logger (default zap.NewNop()).
	Logger *zap.Logger
	// Metrics (nil: none).
	Metrics *Metrics
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Members is this replica's view of the live replicas.
type Members struct {
	kv   jetstream.KeyValue
	key  string
	opts Options
	log  *zap.Logger

	view atomic.Pointer[view]

	// Owned by the loop goroutine.
	seen     map[string]time.Time // key -> when its last heartbeat arrived
	synced   bool
	started  time.Time
	lastBeat time.Time // last heartbeat the server took
	failing  int       // consecutive failed heartbeats
	lastWarn time.Time

	stop context.CancelFunc
	done chan struct{}
	once sync.Once
}

// view is one immutable state of the membership, read by Owns.
type view struct {
	all   bool     // own every run: membership unknown
	seeds []uint64 // the live members' hashes, sorted by key
	self  int      // index of this member in seeds
	keys  []string
}

// heartbeat is a member's value.
type heartbeat struct {
	Name      string    `json:"name"`
	StartedAt time.Time `json:"startedAt"`
}

// Open creates the bucket if needed (the sidecar's NATS user may create
// but not update buckets), writes this replica's first heartbeat and
// starts the goroutine that keeps it alive and follows the others. The
// first heartbeat must succeed: a replica that cannot write one is not
// started. Until Close, Owns answers.
func Open(ctx context.Context, js jetstream.JetStream, opts Options) (*Members, error) {
	if opts.Bucket == "" {
		opts.Bucket = DefaultBucket
	}
	if opts.Heartbeat <= 0 {
		opts.Heartbeat = 2 * time.Second
	}
	if opts.DeadAfter <= 0 {
		opts.DeadAfter = 5 * opts.Heartbeat
	}
	if opts.DeadAfter < 2*opts.Heartbeat {
		return nil, fmt.Errorf("%w: DeadAfter %s is less than two heartbeats (%s)", ErrInvalidOptions, opts.DeadAfter, opts.Heartbeat)
	}
	if opts.Replicas <= 0 {
		opts.Replicas = 1
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	kv, err := natsstore.OpenBucket(ctx, js, jetstream.KeyValueConfig{
		Bucket:      opts.Bucket,
		Description: "heartbeats of the sidecar replicas; the live ones share the per-run background work",
		// A key outlives its member's last heartbeat by a minute at most
		// (a replica killed -9 never deletes it).
		TTL: max(time.Minute, 2*opts.DeadAfter), History: 1, Storage: jetstream.FileStorage, Replicas: opts.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: open bucket %s: %w", ErrUnavailable, opts.Bucket, err)
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	m := &Members{
		kv: kv, key: "m-" + hex.EncodeToString(id[:]), opts: opts, log: opts.Logger.Named("membership"),
		seen: map[string]time.Time{}, started: opts.Now(), done: make(chan struct{}),
	}
	m.view.Store(&view{all: true})
	if err := m.beat(ctx); err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	kw, err := natsstore.Watch(wctx, kv, jetstream.AllKeys, m.log)
	if err != nil {
		cancel()
		// Leave again (best effort): a key left behind would count as a
		// live member until its heartbeat is DeadAfter old.
		_ = kv.Delete(context.WithoutCancel(ctx), m.key)
		return nil, fmt.Errorf("%w: watch bucket %s: %w", ErrUnavailable, opts.Bucket, err)
	}
	m.stop = cancel
	go m.loop(wctx, kw)
	return m, nil
}

// Key is this member's key in the bucket.
func (m *Members) Key() string { return m.key }

// Owns reports whether this replica does the per-run background work of
// runID: true for the live member that rendezvous hashing ranks first for
// it, and for every run while the membership is unknown.
func (m *Members) Owns(runID string) bool {
	v := m.view.Load()
	if v.all {
		return true
	}
	return v.owner(runID) == v.self
}

// Live returns the keys of the members this replica counts as live,
// sorted, and whether it owns every run because it cannot tell.
func (m *Members) Live() (keys []string, ownsAll bool) {
	v := m.view.Load()
	return slices.Clone(v.keys), v.all
}

func (v *view) owner(runID string) int {
	h := hash(runID)
	best, bestScore := 0, uint64(0)
	for i, s := range v.seeds {
		if score := mix(s ^ h); i == 0 || score > bestScore {
			best, bestScore = i, score
		}
	}
	return best
}

// Close stops the heartbeat and deletes this member's key, so that the
// others take over its runs at once; ctx bounds the delete.
func (m *Members) Close(ctx context.Context) error {
	var err error
	m.once.Do(func() {
		m.stop()
		<-m.done
		if derr := m.kv.Delete(ctx, m.key); derr != nil {
			err = fmt.Errorf("%w: delete member %s: %w", ErrUnavailable, m.key, derr)
		}
	})
	return err
}

func (m *Members) loop(ctx context.Context, kw jetstream.KeyWatcher) {
	defer close(m.done)
	defer func() {
		if kw != nil {
			_ = kw.Stop()
		}
	}()
	t := time.NewTicker(m.opts.Heartbeat)
	defer t.Stop()
	updates := kw.Updates()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			bctx, cancel := context.WithTimeout(ctx, m.opts.Heartbeat)
			err := m.beat(bctx)
			cancel()
			m.noteBeat(err)
			if kw == nil {
				kw = m.rewatch(ctx)
				updates = watchUpdates(kw)
			}
			m.publish()
		case e, ok := <-updates:
			if !ok {
				// The watch ended (it should not before Stop): without it
				// the others look dead, so this replica owns every run
				// (publish sees no heartbeats), and it watches anew.
				_ = kw.Stop()
				kw = m.rewatch(ctx)
				updates = watchUpdates(kw)
				m.publish()
				continue
			}
			m.apply(e)
			m.publish()
		}
	}
}

// rewatch forgets the members seen and starts a new watch, or returns nil
// (the next heartbeat tick tries again).
func (m *Members) rewatch(ctx context.Context) jetstream.KeyWatcher {
	clear(m.seen)
	m.synced = false
	kw, err := natsstore.Watch(ctx, m.kv, jetstream.AllKeys, m.log)
	if err != nil {
		m.warn("cannot watch the members; this replica does every run's background work until it can", zap.Error(err))
		return nil
	}
	return kw
}

// watchUpdates is kw's channel, or nil (never ready) without a watch.
func watchUpdates(kw jetstream.KeyWatcher) <-chan jetstream.KeyValueEntry {
	if kw == nil {
		return nil
	}
	return kw.Updates()
}

func (m *Members) apply(e jetstream.KeyValueEntry) {
	if e == nil {
		m.synced = true
		return
	}
	switch e.Operation() {
	case jetstream.KeyValuePut:
		if !m.synced {
			// What the bucket held when the watch began: a member killed
			// -9 leaves its key for a minute, so only a heartbeat that
			// arrives while watching counts (every live member beats
			// within one Heartbeat; until then this replica owns their
			// runs too).
			return
		}
		m.seen[e.Key()] = m.opts.Now()
	default: // a member left (or an operator removed it)
		delete(m.seen, e.Key())
	}
}

func (m *Members) beat(ctx context.Context) error {
	b, _ := json.Marshal(heartbeat{Name: m.opts.Name, StartedAt: m.started.UTC()})
	if _, err := m.kv.Put(ctx, m.key, b); err != nil {
		return fmt.Errorf("%w: heartbeat %s: %w", ErrUnavailable, m.key, err)
	}
	m.lastBeat = m.opts.Now()
	return nil
}

func (m *Members) noteBeat(err error) {
	if err == nil {
		if m.failing > 0 {
			m.log.Info("heartbeat written again", zap.Int("failedHeartbeats", m.failing))
		}
		m.failing = 0
		return
	}
	m.failing++
	m.opts.Metrics.heartbeatFailed()
	m.warn("cannot write this replica's heartbeat; after "+m.opts.DeadAfter.String()+" the others take over its runs and it does every run's work until the heartbeat works",
		zap.Int("consecutiveFailures", m.failing), zap.Error(err))
}

// warn logs at most once a minute.
func (m *Members) warn(msg string, fields ...zap.Field) {
	if now := m.opts.Now(); now.Sub(m.lastWarn) >= time.Minute {
		m.lastWarn = now
		m.log.Warn(msg+" (logged at most once a minute)", fields...)
	}
}

// publish computes the view from the heartbeats seen.
func (m *Members) publish() {
	now := m.opts.Now()
	v := &view{keys: []string{m.key}}
	for k, at := range m.seen {
		if now.Sub(at) >= m.opts.DeadAfter {
			delete(m.seen, k)
			continue
		}
		if k != m.key {
			v.keys = append(v.keys, k)
		}
	}
	slices.Sort(v.keys)
	v.seeds = make([]uint64, len(v.keys))
	for i, k := range v.keys {
		v.seeds[i] = hash(k)
		if k == m.key {
			v.self = i
		}
	}
	// Unknown: the watch has not delivered what the bucket held, or this
	// replica's own heartbeat is older than half of DeadAfter (the others
	// may write it off before it notices).
	v.all = !m.synced || now.Sub(m.lastBeat) >= m.opts.DeadAfter/2
	prev := m.view.Swap(v)
	m.opts.Metrics.set(len(v.keys), v.all)
	if !slices.Equal(prev.keys, v.keys) || prev.all != v.all {
		m.log.Info("members changed", zap.Strings("live", v.keys), zap.String("self", m.key), zap.Bool("ownsEveryRun", v.all))
	}
}

// hash is FNV-1a, 64 bits.
func hash(s string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(s))
	return h.Sum64()
}

// mix is splitmix64's finalizer: FNV's low bits change little between
// similar keys, so the rendezvous score mixes member and run first.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Streams are the JetStream streams the members keep their state in:
// the heartbeat bucket's.
func (m *Members) Streams() []string { return []string{"KV_" + m.kv.Bucket()} }
