package statestore_test

import (
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

func TestStore_Conformance(t *testing.T) {
	t.Run("memstore", func(t *testing.T) {
		storetest.RunSuite(t, func(t *testing.T) statestore.Store {
			return memstore.New(statestore.ProjectorOptions{Logger: zaptest.NewLogger(t)})
		})
	})
}
