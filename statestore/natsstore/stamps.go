package natsstore

import (
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// stampBuffer is the capacity of the channel that receives the stream's
// republished headers. Stamps nobody waits for (other sidecars' appends) are
// dropped when the channel is drained or, while no append drains it, once it
// is full.
const stampBuffer = 64 << 10

// stamps collects the server's republished headers of stored messages
// (stream RePublish, headers only): stream, subject, sequence and the stored
// timestamp, sent by the server right after storing and before the publish
// ack, on the same connection. nats.go puts a message for a channel
// subscription into the channel in its read loop, before it hands the ack
// that follows to the publisher; so once an Append holds its ack, its stamp
// is in the channel or was never sent, and take needs no timeout.
type stamps struct {
	stream string
	ch     chan *nats.Msg
	sub    *nats.Subscription

	mu      sync.Mutex
	waiting map[string]*stampSlot
}

type stampSlot struct {
	refs int
	msg  *storedMsg
}

func subscribeStamps(nc *nats.Conn, stream, subject string) (*stamps, error) {
	st := &stamps{stream: stream, ch: make(chan *nats.Msg, stampBuffer), waiting: make(map[string]*stampSlot)}
	sub, err := nc.ChanSubscribe(subject, st.ch)
	if err != nil {
		return nil, err
	}
	st.sub = sub
	return st, nil
}

// wait registers interest in the stamp of subj; call it before publishing
// and done after take.
func (st *stamps) wait(subj string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	slot := st.waiting[subj]
	if slot == nil {
		slot = &stampSlot{}
		st.waiting[subj] = slot
	}
	slot.refs++
}

func (st *stamps) done(subj string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if slot := st.waiting[subj]; slot != nil {
		if slot.refs--; slot.refs <= 0 {
			delete(st.waiting, subj)
		}
	}
}

// take drains the channel, handing each stamp to its waiter, and returns
// the stamp of subj, or nil if none arrived.
func (st *stamps) take(subj string) *storedMsg {
	st.mu.Lock()
	defer st.mu.Unlock()
	for {
		select {
		case m := <-st.ch:
			st.deliver(m)
			continue
		default:
		}
		break
	}
	if slot := st.waiting[subj]; slot != nil {
		return slot.msg
	}
	return nil
}

// deliver parses m if someone waits for its subject. As everywhere, the
// server's Nats-* headers are the last of their name.
func (st *stamps) deliver(m *nats.Msg) {
	slot := st.waiting[last(m.Header.Values(hdrSubject))]
	if slot == nil || last(m.Header.Values(hdrStream)) != st.stream {
		return
	}
	seq, err := strconv.ParseUint(last(m.Header.Values(hdrSequence)), 10, 64)
	if err != nil {
		return
	}
	ts, err := time.Parse(time.RFC3339Nano, last(m.Header.Values(hdrTimeStamp)))
	if err != nil {
		return
	}
	slot.msg = &storedMsg{subject: last(m.Header.Values(hdrSubject)), seq: seq, time: ts}
}

func (st *stamps) close() error { return st.sub.Unsubscribe() }
