package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// openNATS starts the embedded server (without NATSURL) and connects to
// NATS as the sidecar's least-privileged user. NATS is ready while the
// connection is, the embedded server can write, and JetStream can store.
func (n *Node) openNATS(ctx context.Context) error {
	nc, err := n.connectNATS()
	if err != nil {
		return err
	}
	n.nc, n.lost = nc, nc.StatusChanged(nats.CLOSED)
	srv := n.srv
	n.add(part{name: "nats", close: func(context.Context) error {
		nc.Close()
		if srv != nil {
			srv.Shutdown()
		}
		return nil
	}, check: n.checkNATS})
	if n.js, err = jetstream.New(nc); err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	if err := checkClusterSize(nc, n.cfg.Replicas); err != nil {
		return err
	}
	if srv != nil {
		if a := srv.Addr(); a != nil {
			// Never reachable by an http step or a webhook.
			n.cfg.Own = append(n.cfg.Own, a.String())
			d, err := listenerAddr(a.String())
			if err != nil {
				return err
			}
			n.cfg.Exec.HTTPDeny = append(n.cfg.Exec.HTTPDeny, d)
		}
	}
	return nil
}

func (n *Node) connectNATS() (*nats.Conn, error) {
	events := newNATSEvents(n.log).options()
	if n.cfg.NATSURL == "" {
		ec := n.cfg.Embedded
		ec.Logger = n.log
		ec.Permissions = natsstore.Permissions(natsstore.DefaultSubjectPrefix, n.cfg.Bus.natsSubjects()...)
		ec.RetentionPermissions = retentionPermissions()
		srv, err := natsstore.StartEmbedded(ec)
		if err != nil {
			return nil, err
		}
		n.srv = srv
		if addr := srv.Addr(); addr != nil {
			n.log.Info("embedded nats listens for other replicas (user "+natsstore.SidecarUser+")", zap.String("addr", addr.String()))
		}
		nc, err := srv.Connect(append(events, nats.Name("sidecar "+n.cfg.WorkerID))...)
		if err != nil {
			srv.Shutdown()
		}
		return nc, err
	}
	opts := append(append(append(liveness(), n.cfg.NATSOptions...), events...), nats.Name("sidecar "+n.cfg.WorkerID), nats.MaxReconnects(-1))
	nc, err := nats.Connect(n.cfg.NATSURL, opts...)
	if err != nil {
		// Not retried (nats.go reconnects only a connection it made):
		// a wrong address, or a server that does not speak NATS there
		// (no INFO: an i/o timeout), is a mistake to fix.
		return nil, fmt.Errorf("connect to nats %s: %w; check --nats-url: a NATS server's client port (4222 by default), and that the server runs", n.cfg.NATSURLShown, err)
	}
	return nc, nil
}

// A connection to an external NATS server pings it every
// natsPingInterval and takes it for dead once natsMaxPingsOut pings are
// unanswered, then reconnects to another node of the cluster: a server
// that stops answering without closing its connections (a hung host, a
// partition) is left within about 20 s. nats.go's defaults (2 minutes, 2)
// kept such a connection 4 to 6 minutes, every request on it waiting out
// its timeout meanwhile (e2e: TestE2E_NATSNodeFrozen). A ping is a few
// bytes; a server busy enough to leave four unanswered is not serving.
const (
	natsPingInterval = 5 * time.Second
	natsMaxPingsOut  = 4
)

// liveness is the options of natsPingInterval and natsMaxPingsOut.
func liveness() []nats.Option {
	return []nats.Option{nats.PingInterval(natsPingInterval), nats.MaxPingsOutstanding(natsMaxPingsOut)}
}

func (n *Node) checkNATS(ctx context.Context) error {
	if !n.nc.IsConnected() {
		return errors.New("nats not connected")
	}
	if n.srv != nil {
		if err := n.srv.Check(); err != nil {
			return err
		}
	}
	if _, err := n.js.AccountInfo(ctx); err != nil {
		return fmt.Errorf("jetstream cannot store: %w", err)
	}
	return nil
}
