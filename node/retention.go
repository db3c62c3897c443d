package node

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/admission"
	"github.com/conductor-sidecar/sidecar/archive"
	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/registry"
	"github.com/conductor-sidecar/sidecar/retention"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore"
)

// Retention is how long finished runs stay in hot state and where they go
// then (docs/retention.md). Finished zero: retention is off, nothing is
// ever removed.
type Retention struct {
	// Finished is how long a finished run stays after its last record;
	// PerTenant overrides it per tenantId.
	Finished  time.Duration
	PerTenant map[string]time.Duration
	// Interval is how often retention looks for due runs (0: its default).
	Interval time.Duration
	// Archive is the archive's URL (file:///dir or s3://bucket/prefix).
	Archive string
	// ArchiveKeys, when set, sign every archive manifest written and check
	// the signed ones read (archive.Options.Keys).
	ArchiveKeys *archive.Keys
	// Store is the PostgreSQL URL retention removes runs through, as the
	// retention role (docs/postgres.md, "Retention"); required with a
	// PostgreSQL log, unused with JetStream.
	Store string
	// Conductor also removes a removed run's workflow from Conductor
	// (adapter.WorkflowRemover), before the run's records leave.
	Conductor bool
	// NATSOptions connect to NATSURL as natsstore.RetentionUser (its
	// credentials and TLS); unused with the embedded server, which
	// connects that user in-process.
	NATSOptions []nats.Option
}

func (r Retention) enabled() bool { return r.Finished > 0 }

// runKeys are the buckets whose keys of a run are named by its run token
// and leave with it, purged by the remover: its snapshot, its event ids
// and its alert marks. The run index, the pause bucket and admission's
// entries, whose components read or mirror them, are forgotten by their
// own packages' Forgetters (forgetBuckets).
var runKeys = []natsstore.RunKeys{
	{Bucket: natsstore.DefaultSnapshotBucket, Keys: natsstore.RunKey},
	{Bucket: registry.DefaultBucket, Keys: natsstore.RunKeyPrefix},
	{Bucket: natsstore.DefaultAlertBucket, Keys: natsstore.RunKeyPrefix},
}

// forgetBuckets are the buckets the Forgetters purge keys of.
var forgetBuckets = []string{adapter.DefaultRunsBucket, drain.DefaultBucket, admission.Bucket}

// retentionPermissions are RetentionUser's on the embedded server: it may
// purge the buckets of runKeys and forgetBuckets (deploy/nats/sidecar.conf
// names the same).
func retentionPermissions() *server.Permissions {
	var buckets []string
	for _, k := range runKeys {
		buckets = append(buckets, k.Bucket)
	}
	buckets = append(buckets, forgetBuckets...)
	return natsstore.RetentionPermissions(natsstore.DefaultStream, natsstore.DefaultStateBucket, buckets...)
}

// openRetention starts the loop that archives and removes finished runs,
// or, without retention, says that hot state grows without bound and
// exports the log's size either way.
func (n *Node) openRetention(ctx context.Context) error {
	switch s := n.store.(type) {
	case *natsstore.Store:
		n.reg.MustRegister(s.SizeCollector())
	case *pgstore.Store:
		n.reg.MustRegister(s.SizeCollector())
	}
	_, onJetStream := n.store.(*natsstore.Store)
	if n.srv != nil {
		n.reg.MustRegister(natsstore.DataDirCollector(n.cfg.Embedded.DataDir))
	}
	// Retention's metrics exist from start, retention or not: 0 is not
	// failing.
	metrics := retention.NewMetrics(n.reg)
	rc := n.cfg.Retention
	if !rc.enabled() {
		n.log.Warn("no retention configured (--retain-finished): the sidecar keeps every run it ever ran, and its state grows without bound; watch sidecar_log_bytes (docs/retention.md)")
		return nil
	}
	if pg, ok := n.store.(*pgstore.Store); ok && rc.Store == "" {
		return fmt.Errorf("retention (--retain-finished) on PostgreSQL needs --retention-store postgres://RETENTION_ROLE@host:port/database, the role that may remove runs (docs/postgres.md, \"Retention\"; database %s)", pg.Pool().Config().ConnConfig.Database)
	}
	dest, err := archive.ParseURL(rc.Archive)
	if err != nil {
		return fmt.Errorf("--archive: %w", err)
	}
	arch, err := archive.Open(ctx, dest, archive.Options{Keys: rc.ArchiveKeys})
	if err != nil {
		return fmt.Errorf("open the archive %s: %w", dest, err)
	}
	n.archive = arch
	// Open lets a destination that cannot be read pass (serve starts while
	// the archive is down): say so now, not at the first due run.
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	if err := arch.Check(cctx); err != nil {
		n.log.Warn("the archive cannot be read now: no finished run leaves hot state until it can; check --archive (bucket, prefix, directory) and its credentials (AWS_* variables), then sidecar archive verify (docs/retention.md)",
			zap.String("archive", dest.String()), zap.Error(err))
	}
	cancel()
	if d, ok := dest.(*archive.Dir); ok {
		if err := d.CheckWritable(); err != nil {
			n.log.Warn("the archive directory cannot be written: no finished run leaves hot state until it can; give serve's user write access to it (docs/retention.md)",
				zap.String("archive", dest.String()), zap.Error(err))
		}
	}
	rjs, err := n.retentionJetStream()
	if err != nil {
		_ = arch.Close(ctx)
		return err
	}
	var rm retention.Remover
	if onJetStream {
		rm, err = natsstore.OpenRemover(ctx, rjs, natsstore.RemoverOptions{Logger: n.log, RunKeys: runKeys})
	} else {
		rm, err = n.pgRemover(ctx)
	}
	if err != nil {
		_ = arch.Close(ctx)
		return err
	}
	// The head that runs which left went to, as hot state noted it: the
	// archive answers reads as unavailable until its destination holds it
	// (a volume not mounted yet), as retention archives nothing there.
	if hk, ok := rm.(retention.HeadKeeper); ok {
		hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		seq, chain, _, err := hk.ArchiveHead(hctx)
		cancel()
		if err != nil {
			n.log.Warn("the archive's head noted in hot state cannot be read now; retention checks it before it archives anything", zap.Error(err))
		} else if seq > 0 {
			arch.Expect(seq, chain)
		}
	}
	// Conductor's copy first: while Conductor does not remove it, the run
	// stays whole in hot state, and so in the run list. Then the run list's
	// row leaves with its run, on every replica.
	var forget []retention.Forgetter
	if rc.Conductor {
		forget = append(forget, adapter.NewWorkflowRemover(n.conductor, n.store, n.log))
	}
	forget = append(forget, n.list)
	// Every other per-run key leaves with the run too, forgotten by the
	// package that owns it before the run's records are removed.
	purger := natsstore.NewKeyPurger(rjs)
	forget = append(forget, adapter.NewRunIndexForgetter(n.runs, purger), drain.NewKeysForgetter(n.pauseKeys, purger))
	if n.admit != nil {
		forget = append(forget, admission.NewForgetter(n.admit, purger))
	}
	// Last, the store's projector lets go of the run's snapshot in memory.
	if f, ok := n.store.(retention.Forgetter); ok {
		forget = append(forget, f)
	}
	r, err := retention.New(n.store, arch, rm, retention.Options{
		RetainFinished: rc.Finished, PerTenant: rc.PerTenant, Interval: rc.Interval,
		Forgetters: forget, Logger: n.log, Metrics: metrics,
	})
	if err != nil {
		return err
	}
	if err := r.Open(ctx); err != nil {
		return err
	}
	n.add(part{name: "retention", close: func(ctx context.Context) error {
		err := r.Close(ctx)
		_ = arch.Close(ctx)
		return err
	}})
	n.log.Info("retention: finished runs leave hot state once archived", zap.Duration("retainFinished", rc.Finished), zap.String("archive", dest.String()), zap.Bool("conductor", rc.Conductor))
	return nil
}

// retentionJetStream connects as natsstore.RetentionUser (the purges of
// log's Remover.
func (n *Node) retentionJetStream() (jetstream.JetStream, error) {
	var nc *nats.Conn
	var err error
	if n.srv != nil {
		nc, err = n.srv.ConnectRetention()
	} else {
		nc, err = nats.Connect(n.cfg.NATSURL, append(append(liveness(), n.cfg.Retention.NATSOptions...), nats.Name("sidecar retention "+n.cfg.WorkerID))...)
	}
	if err != nil {
		return nil, fmt.Errorf("connect as %s: %w", natsstore.RetentionUser, err)
	}
	n.add(part{name: "retention connection", close: func(context.Context) error { nc.Close(); return nil }})
	return jetstream.New(nc)
}

// pgRemover connects to Retention.Store as the retention role and opens
// the PostgreSQL log's Remover.
func (n *Node) pgRemover(ctx context.Context) (retention.Remover, error) {
	rm, err := pgstore.OpenRemover(ctx, n.cfg.Retention.Store, pgstore.RemoverOptions{Logger: n.log})
	if err != nil {
		return nil, fmt.Errorf("--retention-store: %w", err)
	}
	n.add(part{name: "retention store", close: func(context.Context) error { rm.Close(); return nil }})
	return rm, nil
}
