package natsstore

import (
	"context"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// sizeTimeout bounds the stream-info request of one scrape.
const sizeTimeout = 2 * time.Second

// SizeCollector exports the event stream's size at each scrape:
// sidecar_log_bytes and sidecar_log_records (what the stream holds now),
// sidecar_log_last_sequence (every record ever appended, removed or not).
// A scrape the server does not answer within 2 s exports none of them.
// Register it with the node's registry.
func (s *Store) SizeCollector() prometheus.Collector { return &sizeCollector{s: s} }

var (
	logBytesDesc   = prometheus.NewDesc("sidecar_log_bytes", "Bytes the run event log holds now (JetStream: the event stream's message bytes).", nil, nil)
	logRecordsDesc = prometheus.NewDesc("sidecar_log_records", "Records the run event log holds now.", nil, nil)
	logLastDesc    = prometheus.NewDesc("sidecar_log_last_sequence", "Sequence of the last record appended to the log: every record ever appended, including those retention removed.", nil, nil)
)

type sizeCollector struct{ s *Store }

func (c *sizeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- logBytesDesc
	ch <- logRecordsDesc
	ch <- logLastDesc
}

func (c *sizeCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), sizeTimeout)
	defer cancel()
	st, err := c.s.js.Stream(ctx, c.s.name)
	if err != nil {
		return
	}
	state := st.CachedInfo().State
	ch <- prometheus.MustNewConstMetric(logBytesDesc, prometheus.GaugeValue, float64(state.Bytes))
	ch <- prometheus.MustNewConstMetric(logRecordsDesc, prometheus.GaugeValue, float64(state.Msgs))
	ch <- prometheus.MustNewConstMetric(logLastDesc, prometheus.GaugeValue, float64(state.LastSeq))
}

// DataDirCollector exports the file system of the embedded server's data
// dir at each scrape: sidecar_data_dir_free_bytes (free to an
// unprivileged writer) and sidecar_data_dir_size_bytes. The alert
// DATA_DIR_FULL_PREDICTED extrapolates the first.
func DataDirCollector(dir string) prometheus.Collector { return &dataDirCollector{dir: dir} }

var (
	dirFreeDesc = prometheus.NewDesc("sidecar_data_dir_free_bytes", "Bytes free on the file system of the embedded NATS server's data dir.", nil, nil)
	dirSizeDesc = prometheus.NewDesc("sidecar_data_dir_size_bytes", "Size in bytes of the file system of the embedded NATS server's data dir.", nil, nil)
)

type dataDirCollector struct{ dir string }

func (c *dataDirCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- dirFreeDesc
	ch <- dirSizeDesc
}

func (c *dataDirCollector) Collect(ch chan<- prometheus.Metric) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(c.dir, &st); err != nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(dirFreeDesc, prometheus.GaugeValue, float64(st.Bavail*uint64(st.Bsize)))
	ch <- prometheus.MustNewConstMetric(dirSizeDesc, prometheus.GaugeValue, float64(st.Blocks*uint64(st.Bsize)))
}
