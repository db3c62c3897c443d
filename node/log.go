package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/registry"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore"
)

// openLog opens the run event log, the EventIdRegistry and the control
// API's kept replies: on JetStream, or all three in one PostgreSQL
// database (Config.Postgres); and the alert gate, on JetStream either way.
// The log is ready while it can append.
func (n *Node) openLog(ctx context.Context) error {
	var err error
	if n.gate, err = natsstore.OpenAlertGate(ctx, n.js, natsstore.AlertGateOptions{Replicas: n.cfg.Replicas}); err != nil {
		return err
	}
	n.add(part{name: "alerts", streams: n.gate.Streams()})
	var ids *registry.Registry
	if n.cfg.Postgres != "" {
		ids, err = n.openPostgres(ctx)
	} else {
		ids, err = n.openJetStreamLog(ctx)
	}
	if err != nil {
		return err
	}
	var appender registry.Appender = n.store
	if n.cfg.ValidateWrites {
		if appender, err = statestore.NewValidatingStore(n.store); err != nil {
			return err
		}
	}
	n.emitter = registry.NewEmitter(ids, appender)
	return nil
}

func (n *Node) openJetStreamLog(ctx context.Context) (*registry.Registry, error) {
	ns, err := natsstore.Open(ctx, n.js, natsstore.Options{Logger: n.log, Metrics: statestore.NewMetrics(n.reg), Gate: n.gate, Replicas: n.cfg.Replicas,
		SnapshotBucket: natsstore.DefaultSnapshotBucket, Removable: n.cfg.Retention.enabled()})
	if err != nil {
		return nil, err
	}
	n.store = ns
	n.add(part{name: "log", close: func(context.Context) error { _ = ns.Close(); return nil }, check: ns.Check, streams: ns.Streams()})
	ids, err := registry.Open(ctx, n.js, registry.Options{Logger: n.log, Metrics: registry.NewMetrics(n.reg), Replicas: n.cfg.Replicas})
	if err != nil {
		return nil, err
	}
	n.add(part{name: "event ids", streams: ids.Streams()})
	replies, err := httpapi.OpenKVReplies(ctx, n.js, httpapi.KVRepliesOptions{Replicas: n.cfg.Replicas, MaxBytes: n.cfg.RepliesMaxBytes, Log: n.log})
	if err != nil {
		return nil, err
	}
	n.replies = replies
	n.reg.MustRegister(replies.SizeCollector())
	n.add(part{name: "replies", streams: replies.Streams()})
	return ids, nil
}

func (n *Node) openPostgres(ctx context.Context) (*registry.Registry, error) {
	pg, err := pgstore.Open(ctx, n.cfg.Postgres, pgstore.Options{Logger: n.log, Metrics: statestore.NewMetrics(n.reg), Gate: n.gate, DurableSnapshots: true})
	if err != nil {
		return nil, err
	}
	n.store = pg
	n.add(part{name: "log", close: func(context.Context) error { pg.Close(); return nil }, check: pg.Check})
	ids, err := registry.OpenPostgres(ctx, pg.Pool(), registry.PostgresOptions{Logger: n.log, Metrics: registry.NewMetrics(n.reg), MaxWait: pg.MaxWait()})
	if err != nil {
		return nil, err
	}
	replies, err := httpapi.OpenPostgresReplies(ctx, pg.Pool(), 0, pg.MaxWait())
	if err != nil {
		return nil, err
	}
	replies.MaxBytes = n.cfg.RepliesMaxBytes
	n.replies = replies
	n.log.Info("run event log, event ids and control replies on postgresql", zap.String("database", pg.Pool().Config().ConnConfig.Database))
	return ids, nil
}

// pairNATS checks, before anything is written, that the NATS state this
// sidecar has (the run index above all) is the one the PostgreSQL log was
// used with: the run index's creation time is its identity. A sidecar on
// the right database and the wrong NATS state would not know the runs in
// flight (they would stay RUNNING: TestE2E_PostgresStoreLostNATSState).
func (n *Node) pairNATS(ctx context.Context, pg *pgstore.Store) error {
	st, err := natsstore.BindStream(ctx, n.js, "KV_"+adapter.DefaultRunsBucket)
	if err != nil {
		return fmt.Errorf("read the run index's stream: %w", err)
	}
	state := fmt.Sprintf("run index %s created %s", adapter.DefaultRunsBucket, st.CachedInfo().Created.UTC().Format(time.RFC3339Nano))
	if _, err := pg.Pair(ctx, state, n.cfg.AcceptNewNATSState); err != nil {
		if errors.Is(err, pgstore.ErrOtherNATSState) {
			return fmt.Errorf("%w: start with the --data-dir (or --nats-url) it was used with: the runs in flight are known only there; "+
				"if that state is gone for good, start once with --accept-new-nats-state (runs in flight then stay RUNNING in Conductor: cancel them there)", err)
		}
		return err
	}
	return nil
}
