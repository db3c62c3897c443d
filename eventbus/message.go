package eventbus

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/vocab"
)

// Message is one event as a sink delivers it: in the sink's vocabulary,
// with what consumers key and route it by.
type Message struct {
	// ID is the event's id in its vocabulary: the consumer's dedup key
	// (a redelivery carries the same ID).
	ID string
	// Type is the event's type in the sink's vocabulary.
	Type                    string
	RunID, TenantID, PlanID string
	PersistedAt             string
	// Seq is the log's sequence of the record the event comes from: the
	// sink's cursor moves past it once every event of the record is
	// acknowledged.
	Seq uint64
	// Body is the event, JSON.
	Body []byte
}

// Fetcher reads a run's records; the vocabularies other than the log's
// own fold a run's events from its first, so a batch's events of a run
// are translated with the run's earlier records.
type Fetcher interface {
	Fetch(ctx context.Context, runID string, afterSeq int64, limit int) ([]statestore.RunEventRecord, error)
}

// translate turns recs (in log order) into the messages of vocabulary v,
// in the same order.
func translate(ctx context.Context, v string, src Fetcher, recs []statestore.RunEventRecord) ([]Message, error) {
	if v == vocab.Sidecar {
		out := make([]Message, 0, len(recs))
		for i := range recs {
			m, err := message(recs[i], vocab.View{Event: recs[i], ID: recs[i].EventID, Type: recs[i].EventType})
			if err != nil {
				return nil, err
			}
			out = append(out, m)
		}
		return out, nil
	}
	// Group by run, translate each run's records after its earlier ones,
	// then put the messages back in log order.
	byRun := map[string][]int{}
	for i := range recs {
		byRun[recs[i].RunID] = append(byRun[recs[i].RunID], i)
	}
	perRecord := make([][]Message, len(recs))
	for runID, idx := range byRun {
		first := recs[idx[0]].RunSeq
		earlier, err := src.Fetch(ctx, runID, 0, 0)
		if err != nil {
			return nil, err
		}
		n := 0
		for n < len(earlier) && earlier[n].RunSeq < first {
			n++
		}
		all := append(earlier[:n:n], pick(recs, idx)...)
		views, err := vocab.Views(v, all)
		if err != nil {
			return nil, err
		}
		for _, view := range views {
			if view.Record < n {
				continue
			}
			i := idx[view.Record-n]
			m, err := message(recs[i], view)
			if err != nil {
				return nil, err
			}
			perRecord[i] = append(perRecord[i], m)
		}
	}
	var out []Message
	for _, ms := range perRecord {
		out = append(out, ms...)
	}
	return out, nil
}

func pick(recs []statestore.RunEventRecord, idx []int) []statestore.RunEventRecord {
	out := make([]statestore.RunEventRecord, len(idx))
	for j, i := range idx {
		out[j] = recs[i]
	}
	return out
}

func message(r statestore.RunEventRecord, view vocab.View) (Message, error) {
	body, err := json.Marshal(view.Event)
	if err != nil {
		return Message{}, fmt.Errorf("eventbus: encode %s of run %s: %w", view.Type, r.RunID, err)
	}
	return Message{ID: view.ID, Type: view.Type, RunID: r.RunID, TenantID: r.TenantID, PlanID: r.PlanID,
		PersistedAt: r.PersistedAt, Seq: r.LogSeq, Body: body}, nil
}

// Token renders an id as one NATS subject token: the id itself when it is
// 1 to 64 of [A-Za-z0-9_-], otherwise "~" and its UTF-8 bytes in unpadded
// base64url (ids may hold any character; '.', '*', '>' and spaces would
// break the subject).
func Token(id string) string {
	if len(id) > 0 && len(id) <= 64 && strings.IndexFunc(id, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-')
	}) < 0 {
		return id
	}
	return "~" + base64.RawURLEncoding.EncodeToString([]byte(id))
}
