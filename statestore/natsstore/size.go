package natsstore

import (
	"context"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// SizeCollector exports the event stream's size at each scrape
// (statestore.NewLogSizeCollector): its message bytes and messages, and
// its last sequence (every record ever appended, removed or not). Register
// it with the node's registry.
func (s *Store) SizeCollector() prometheus.Collector {
	return statestore.NewLogSizeCollector(s.logSize)
}

func (s *Store) logSize(ctx context.Context) (statestore.LogSize, error) {
	st, err := s.js.Stream(ctx, s.name)
	if err != nil {
		return statestore.LogSize{}, err
	}
	state := st.CachedInfo().State
	return statestore.LogSize{Bytes: int64(state.Bytes), Records: int64(state.Msgs), LastSequence: int64(state.LastSeq)}, nil
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
