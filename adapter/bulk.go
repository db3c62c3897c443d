package adapter

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
)

// BulkMax is the most workflows one of Conductor's bulk calls takes
// (WorkflowBulkService.MAX_REQUEST_ITEMS): the *Many calls send their ids
// in requests of at most this many.
const BulkMax = 1000

// bulkAnswer is Conductor's BulkResponse.
type bulkAnswer struct {
	Errors    map[string]string `json:"bulkErrorResults"`
	Succeeded []string          `json:"bulkSuccessfulResults"`
}

// PauseMany pauses the workflows ids with Conductor's bulk pause (PUT
// /workflow/bulk/pause; at most pauseChunk ids a request, up to four requests
// at once) and returns the error of
// each workflow it could not pause, as Pause would return it: a workflow
// Conductor refused in the bulk call is paused again with Pause, whose
// error is the one returned (the bulk answer carries a message only). A
// request that failed as a whole gives its error to each of its ids. An
// id missing from the map was paused.
func (c *Client) PauseMany(ctx context.Context, ids []string) map[string]error {
	return c.many(ctx, opBulkPause, http.MethodPut, "/workflow/bulk/pause", ids, pauseChunk, c.Pause)
}

// ResumeMany resumes the workflows ids with Conductor's bulk resume (PUT
// /workflow/bulk/resume), as PauseMany; a refused workflow's error is
// Resume's (CONFLICT with the engine status for a workflow that is not
// paused).
func (c *Client) ResumeMany(ctx context.Context, ids []string) map[string]error {
	return c.many(ctx, opBulkResume, http.MethodPut, "/workflow/bulk/resume", ids, pauseChunk, c.Resume)
}

// TerminateMany terminates the workflows ids with reason through
// Conductor's bulk terminate (POST /workflow/bulk/terminate), as
// PauseMany; a refused workflow's error is Terminate's.
func (c *Client) TerminateMany(ctx context.Context, ids []string, reason string) map[string]error {
	path := "/workflow/bulk/terminate"
	if reason != "" {
		path += "?reason=" + url.QueryEscape(reason)
	}
	return c.many(ctx, opBulkTerminate, http.MethodPost, path, ids, BulkMax, func(ctx context.Context, id string) error {
		return c.Terminate(ctx, id, reason)
	})
}

// many sends ids to the bulk endpoint path in requests of at most most
// (and BulkMax) and asks one for each id the bulk answer refused.
func (c *Client) many(ctx context.Context, op, method, path string, ids []string, most int, one func(context.Context, string) error) map[string]error {
	errs := map[string]error{}
	var valid []string
	for _, id := range ids {
		if id == "" {
			errs[id] = invalidInput(op, "empty workflowId")
			continue
		}
		valid = append(valid, id)
	}
	// Conductor acts on a request's workflows one after the other: the ids
	// go in up to bulkRequests requests at once, so that its threads share
	// them.
	size := c.bulkMax
	if size <= 0 || size > BulkMax {
		size = BulkMax
	}
	size = min(size, most)
	size = max(1, min(size, (len(valid)+bulkRequests-1)/bulkRequests))
	var chunks [][]string
	for len(valid) > 0 {
		chunks = append(chunks, valid[:min(len(valid), size)])
		valid = valid[len(chunks[len(chunks)-1]):]
	}
	var mu sync.Mutex
	var refused []string
	eachOf(len(chunks), bulkRequests, func(i int) {
		chunk := chunks[i]
		ans, err := c.bulkCall(ctx, op, method, path, chunk)
		mu.Lock()
		defer mu.Unlock()
		for _, id := range chunk {
			if err != nil {
				errs[id] = err
			} else if _, ok := ans.Errors[id]; ok {
				refused = append(refused, id)
			}
		}
	})
	// The refusals are rare (a workflow that ended, or is not paused for a
	// resume): each is asked again on its own for an error with a code.
	eachOf(len(refused), bulkRequests, func(i int) {
		if err := one(ctx, refused[i]); err != nil {
			mu.Lock()
			defer mu.Unlock()
			errs[refused[i]] = err
		}
	})
	return errs
}

// bulkPerWorkflow is the time a bulk call gets per workflow on top of the
// client's timeout: Conductor on PostgreSQL under load took over 40 ms per
// workflow of a bulk terminate.
const bulkPerWorkflow = 100 * time.Millisecond

// pauseChunk is the most workflows one bulk pause or resume request
// sends, so that none of them takes longer than LongestPauseCall: a
// follower on another replica waits that long twice before it takes a
// difference such a call leaves for an action made in Conductor
// (drain.GraceFor). Conductor pauses a workflow in about a millisecond of
// its CPU; the bound costs requests, not time.
const pauseChunk = 50

// LongestPauseCall is the longest one of the client's pause or resume
// calls may last, single or bulk (its timeout, and a bulk request's time
// per workflow): a late call of a pause or resume lands within it.
func (c *Client) LongestPauseCall() time.Duration {
	return c.timeout + pauseChunk*bulkPerWorkflow
}

// bulkRequests is how many bulk requests (or single calls for refused
// workflows) a *Many call has in flight at once.
const bulkRequests = 4

// bulkCall sends one request of ids to the bulk endpoint path.
func (c *Client) bulkCall(ctx context.Context, op, method, path string, ids []string) (bulkAnswer, error) {
	var ans bulkAnswer
	body, err := json.Marshal(ids)
	if err != nil {
		return ans, err
	}
	// Conductor acts on the ids one after the other: the call gets
	// bulkPerWorkflow per id on top of the client's timeout (a deadline of
	// ctx's own still rules), so that a slow Conductor that completes the
	// request is not reported as unavailable for every id of it.
	_, err = c.do(ctx, op, time.Duration(len(ids))*bulkPerWorkflow, func(ctx context.Context) (*http.Response, error) {
		// 64 KiB of answer per id bounds even a long refusal for each.
		return c.rawJSON(ctx, c.poll, method, c.base+path, body, int64(len(ids))<<16, &ans)
	})
	return ans, err
}

// eachOf calls f(0..n-1), at most k at once, and returns when every call
// has.
func eachOf(n, k int, f func(i int)) {
	var g errgroup.Group
	g.SetLimit(k)
	for i := range n {
		g.Go(func() error { f(i); return nil })
	}
	_ = g.Wait() // f returns no error
}
