package natsstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Headers and statuses of the direct get API (nats-server 2.11+) and of
// republished messages.
const (
	hdrStream     = "Nats-Stream"
	hdrSequence   = "Nats-Sequence"
	hdrSubject    = "Nats-Subject"
	hdrTimeStamp  = "Nats-Time-Stamp"
	hdrNumPending = "Nats-Num-Pending"
	hdrLastSeq    = "Nats-Last-Sequence"
	hdrUpToSeq    = "Nats-UpTo-Sequence"
	hdrStatus     = "Status"
	hdrDesc       = "Description"

	statusEOB          = "204" // end of a batch or multi_last response
	statusNotFound     = "404" // no message, or no results
	statusTooMany      = "413" // multi_last matched more than 1,024 subjects
	statusNoResponders = "503" // no server answers direct gets for the stream
)

var (
	errNotFound       = errors.New("no message")
	errTooManyResults = errors.New("too many results")
)

// directRequest is the JSON body of a batch or multi_last direct get (and,
// with LastFor, of the leader's STREAM.MSG.GET).
type directRequest struct {
	Seq       uint64   `json:"seq,omitempty"`
	LastFor   string   `json:"last_by_subj,omitempty"`
	NextFor   string   `json:"next_by_subj,omitempty"`
	Batch     int      `json:"batch,omitempty"`
	MaxBytes  int      `json:"max_bytes,omitempty"`
	MultiLast []string `json:"multi_last,omitempty"`
}

// storedMsg is a message as the server stored it.
type storedMsg struct {
	subject string
	seq     uint64
	time    time.Time
	data    []byte
}

// endOfBatch is what the server's end-of-batch status reports: how many
// matching messages follow the last one sent, and the last one's sequence.
// A multi_last answer also says up to which sequence it read: the
// stream's last at the time, unless the request bounded it.
type endOfBatch struct {
	pending uint64
	lastSeq uint64
	upTo    uint64 // 0: not reported (a batch get)
}

func apiPrefix(o jetstream.JetStreamOptions) string {
	switch {
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	case o.APIPrefix != "":
		if o.APIPrefix[len(o.APIPrefix)-1] == '.' {
			return o.APIPrefix
		}
		return o.APIPrefix + "."
	}
	return jetstream.DefaultAPIPrefix
}

// msg returns the message on subject (every subject holds at most one)
// with a direct get that names the subject in the request subject, so the
// server has no JSON to parse.
func (s *Store) msg(ctx context.Context, subject string) (*storedMsg, error) {
	return s.direct(ctx, s.apiPrefix+"DIRECT.GET."+s.name+"."+subject, nil)
}

// nextMsg sends a single direct get (req without Batch or MultiLast) and
// returns its message.
func (s *Store) nextMsg(ctx context.Context, req directRequest) (*storedMsg, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	return s.direct(ctx, s.apiPrefix+"DIRECT.GET."+s.name, body)
}

// direct sends one direct get request that the server answers with one
// message or a status, and waits for the answer at most the store's
// timeout (requestContext).
func (s *Store) direct(ctx context.Context, subject string, body []byte) (*storedMsg, error) {
	ctx, cancel := s.requestContext(ctx)
	defer cancel()
	resp, err := s.nc.RequestWithContext(ctx, subject, body)
	if errors.Is(err, nats.ErrNoResponders) {
		return nil, fmt.Errorf("direct get on stream %s: %w", s.name, err)
	}
	if err != nil {
		return nil, err
	}
	m, status, err := parseDirect(resp)
	if err != nil {
		return nil, err
	}
	if m == nil {
		return nil, statusError(status, resp)
	}
	s.mark.saw(m.seq)
	return m, nil
}

// ackedMsg is msg for a message the server has acknowledged. A direct get
// may be answered by a replica that has not applied it yet; the stream
// leader's message API always has it.
func (s *Store) ackedMsg(ctx context.Context, subject string) (*storedMsg, error) {
	m, err := s.msg(ctx, subject)
	if !errors.Is(err, errNotFound) {
		return m, err
	}
	return s.leaderMsg(ctx, directRequest{LastFor: subject})
}

// leaderMsg sends req (LastFor, or Seq with NextFor) to the stream
// leader's message API, which only the leader answers: slower than a
// direct get (JSON, one message), but never behind.
func (s *Store) leaderMsg(ctx context.Context, req directRequest) (*storedMsg, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	ctx, cancel := s.requestContext(ctx)
	defer cancel()
	resp, err := s.nc.RequestWithContext(ctx, s.apiPrefix+"STREAM.MSG.GET."+s.name, body)
	if err != nil {
		return nil, err
	}
	var r struct {
		Error   *jetstream.APIError `json:"error"`
		Message *struct {
			Subject string    `json:"subject"`
			Seq     uint64    `json:"seq"`
			Data    []byte    `json:"data"`
			Time    time.Time `json:"time"`
		} `json:"message"`
	}
	if err := json.Unmarshal(resp.Data, &r); err != nil {
		return nil, fmt.Errorf("decode message get response: %w", err)
	}
	switch {
	case r.Error != nil && r.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return nil, errNotFound
	case r.Error != nil:
		return nil, r.Error
	case r.Message == nil:
		return nil, errors.New("message get response without a message")
	}
	s.mark.saw(r.Message.Seq)
	return &storedMsg{subject: r.Message.Subject, seq: r.Message.Seq, time: r.Message.Time, data: r.Message.Data}, nil
}

// requestContext bounds the wait for the answer to one request by the
// store's timeout, whatever ctx allows: a request the server never
// answers (lost with a node that died, or dropped by a replica) has no
// answer to wait for, and nats.go waits for one until ctx ends. With a
// context without a deadline (a worker's, an API request's) or a distant
// one, that was for good, and every projection of the run waited for it.
// A longer read is made of several requests, each bounded (Fetch).
func (s *Store) requestContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.timeout)
}

// getBatch sends a batch or multi_last direct get and hands every message to
// fn in the order the server sent it, until the end-of-batch status. It
// waits at most idle for each message (the first, and each next one after
// fn returned): a page of 8 MiB may take long to arrive and decode on a
// loaded machine, while a server that stops answering fails it within idle.
func (s *Store) getBatch(ctx context.Context, req directRequest, idle time.Duration, fn func(*storedMsg)) (endOfBatch, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return endOfBatch{}, err
	}
	// A channel subscription sized to the answer: at most a batch (or, for
	// multi_last, 1,024 subjects) plus the end-of-batch status, so no
	// message is ever dropped. SubscribeSync would allocate the
	// connection's 64k-message channel (512 KiB) for every request.
	n := req.Batch
	if n <= 0 || n > walkBatch {
		n = walkBatch
	}
	ch := make(chan *nats.Msg, n+1)
	inbox := s.nc.NewInbox()
	sub, err := s.nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return endOfBatch{}, err
	}
	defer sub.Unsubscribe() //nolint:errcheck // nothing to do about it
	if err := s.nc.PublishRequest(s.apiPrefix+"DIRECT.GET."+s.name, inbox, body); err != nil {
		return endOfBatch{}, err
	}
	timer := time.NewTimer(idle)
	defer timer.Stop()
	for {
		var resp *nats.Msg
		select {
		case resp = <-ch:
		case <-ctx.Done():
			return endOfBatch{}, ctx.Err()
		case <-timer.C:
			return endOfBatch{}, fmt.Errorf("no answer from the server within %s: %w", idle, context.DeadlineExceeded)
		}
		m, status, err := parseDirect(resp)
		if err != nil {
			return endOfBatch{}, err
		}
		if m != nil {
			s.mark.saw(m.seq)
			fn(m)
			timer.Reset(idle)
			continue
		}
		if status != statusEOB {
			return endOfBatch{}, statusError(status, resp)
		}
		var eob endOfBatch
		if eob.pending, err = strconv.ParseUint(resp.Header.Get(hdrNumPending), 10, 64); err != nil {
			return endOfBatch{}, fmt.Errorf("end of batch: %s: %w", hdrNumPending, err)
		}
		if eob.lastSeq, err = strconv.ParseUint(resp.Header.Get(hdrLastSeq), 10, 64); err != nil {
			return endOfBatch{}, fmt.Errorf("end of batch: %s: %w", hdrLastSeq, err)
		}
		if v := resp.Header.Get(hdrUpToSeq); v != "" {
			if eob.upTo, err = strconv.ParseUint(v, 10, 64); err != nil {
				return endOfBatch{}, fmt.Errorf("end of batch: %s: %w", hdrUpToSeq, err)
			}
			s.mark.saw(eob.upTo) // the stream's last sequence when it was read
		}
		return eob, nil
	}
}

// parseDirect splits a direct get response into a stored message or a
// status. Every message the server sends carries its own Nats-Sequence; a
// status never does. A message published with Nats-* headers of its own
// keeps them in front of the server's, so the last value of each is used.
func parseDirect(resp *nats.Msg) (*storedMsg, string, error) {
	seqs := resp.Header.Values(hdrSequence)
	if len(seqs) == 0 {
		status := resp.Header.Get(hdrStatus)
		if status == "" {
			return nil, "", errors.New("direct get response without sequence or status")
		}
		return nil, status, nil
	}
	seq, err := strconv.ParseUint(seqs[len(seqs)-1], 10, 64)
	if err != nil {
		return nil, "", fmt.Errorf("direct get: %s: %w", hdrSequence, err)
	}
	ts, err := time.Parse(time.RFC3339Nano, last(resp.Header.Values(hdrTimeStamp)))
	if err != nil {
		return nil, "", fmt.Errorf("direct get: %s: %w", hdrTimeStamp, err)
	}
	return &storedMsg{subject: last(resp.Header.Values(hdrSubject)), seq: seq, time: ts, data: resp.Data}, "", nil
}

func statusError(status string, resp *nats.Msg) error {
	switch status {
	case statusNotFound:
		return errNotFound
	case statusTooMany:
		return errTooManyResults
	case statusNoResponders:
		return nats.ErrNoResponders
	}
	return fmt.Errorf("direct get: status %s %s", status, resp.Header.Get(hdrDesc))
}

func last(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}
