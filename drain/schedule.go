package drain

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// RequestedBySchedule is the requestedBy of a RunResumed that a scheduled
// resume recorded.
const RequestedBySchedule = statestore.RequestedBySchedule

// ResumeSchedule remembers, for every replica, the pauses that are to be
// resumed on their own (Keys implements it), so
// that whichever replica owns the run when one is due resumes it, without
// reading every paused run.
type ResumeSchedule interface {
	// ScheduleResume records that e.RunID's pause cycle e.Cycle is to be
	// resumed at e.At; it is called after that cycle's RunPaused persisted.
	ScheduleResume(ctx context.Context, e ScheduledResume) error
	// EndResume removes runID's entry unless it names a later cycle.
	EndResume(ctx context.Context, runID string, cycle int64) error
	// ScheduledResumes lists the entries.
	ScheduledResumes(ctx context.Context) ([]ScheduledResume, error)
}

// ScheduledResume is one entry of the ResumeSchedule.
type ScheduledResume struct {
	RunID string    `json:"runId"`
	Cycle int64     `json:"cycle"`
	At    time.Time `json:"at"`
	// RequestedBy and Reason are set for a resume scheduled after the
	// pause, by a staggered bulk resume (ResumeLater): its RunResumed
	// carries them. Empty: the pause's own resumeAt (requestedBy
	// "schedule").
	RequestedBy string `json:"requestedBy,omitempty"`
	Reason      string `json:"reason,omitempty"`
}

// schedule records a pause's scheduled resume; an entry that cannot be
// written is logged: the full pass resumes the run when it is due.
func (c *Controller) schedule(ctx context.Context, runID string, cycle int64, at time.Time) {
	if c.opts.Schedule == nil {
		return
	}
	if err := c.opts.Schedule.ScheduleResume(ctx, ScheduledResume{RunID: runID, Cycle: cycle, At: at}); err != nil && ctx.Err() == nil {
		c.warns.Warn(c.logger, "cannot record a scheduled resume; the monitor's full pass resumes the run when it is due", zap.String("runId", runID), zap.Error(err))
	}
}

// readSchedule resumes the due pauses of the schedule that this replica
// owns; it reports false when the schedule did not answer.
func (c *Controller) readSchedule(ctx context.Context) bool {
	if c.opts.Schedule == nil {
		return true
	}
	entries, err := c.opts.Schedule.ScheduledResumes(ctx)
	if err != nil {
		if ctx.Err() == nil {
			c.warns.Warn(c.logger, "cannot read the scheduled resumes; the full pass resumes due runs until it works", zap.Error(err))
		}
		return false
	}
	now := c.opts.Now()
	var staggered []ScheduledResume
	for _, e := range entries {
		if e.RequestedBy != "" {
			// A staggered resume: the pacer carries it out at the
			// stagger's rate.
			staggered = append(staggered, e)
			continue
		}
		if now.Before(e.At) || !c.opts.Owner.Owns(e.RunID) {
			continue
		}
		snap, err := c.snapshot(ctx, e.RunID)
		if errors.Is(err, ErrRunNotFound) {
			_ = c.opts.Schedule.EndResume(ctx, e.RunID, e.Cycle)
			continue
		}
		if err != nil {
			return false
		}
		if !c.resumeIfDue(ctx, snap) && (snap.Pause == nil || snap.Pause.Cycle != e.Cycle || snap.Status != statestore.RunStatusPaused) {
			// Resumed by hand, paused again, or ended: nothing is due.
			_ = c.opts.Schedule.EndResume(ctx, e.RunID, e.Cycle)
		}
	}
	c.pacer.sync(staggered, c.opts.Owner.Owns)
	return true
}

// resumeIfDue resumes snap's run when its open pause has a resume time
// that has passed (RunResumed, requestedBy "schedule"; the same event
// whichever replica records it, so there is one). It reports whether it
// resumed the run or found it resumed.
func (c *Controller) resumeIfDue(ctx context.Context, snap *statestore.RunSnapshot) bool {
	p := snap.Pause
	if snap.Status != statestore.RunStatusPaused || p == nil || p.ResumeAt == "" || snap.CancelRequested {
		return false
	}
	at, err := time.Parse(time.RFC3339Nano, p.ResumeAt)
	if err != nil || c.opts.Now().Before(at) {
		return false
	}
	_, err = c.Resume(ctx, snap.RunID, ResumeRequest{RequestedBy: RequestedBySchedule,
		Reason: fmt.Sprintf("scheduled resume at %s", p.ResumeAt)})
	var ee *EngineError
	switch {
	case err == nil, errors.As(err, &ee):
		// Recorded (Conductor's side is retried as any resume's is:
		// the watcher sees the workflow still paused).
		c.opts.Metrics.scheduledResume()
		c.logger.Info("scheduled resume", zap.String("runId", snap.RunID), zap.Int64("cycle", p.Cycle), zap.String("resumeAt", p.ResumeAt), zap.Error(err))
		if c.opts.Schedule != nil {
			_ = c.opts.Schedule.EndResume(ctx, snap.RunID, p.Cycle)
		}
		return true
	case errors.Is(err, statestore.ErrInvalidTransition):
		// A failed step is held: an operator retries it (or cancels the
		// run); the schedule cannot.
		c.warns.Warn(c.logger, "scheduled resume not possible: the run has a failed step held for an operator; the schedule is dropped",
			zap.String("runId", snap.RunID), zap.Error(err))
		if c.opts.Schedule != nil {
			_ = c.opts.Schedule.EndResume(ctx, snap.RunID, p.Cycle)
		}
		return true
	default:
		c.warns.Warn(c.logger, "scheduled resume failed; retrying", zap.String("runId", snap.RunID), zap.Error(err))
		return false
	}
}

// ResumeLater records that runID's open pause is to be resumed at at,
// with req's requestedBy and reason: one step of a staggered bulk resume.
// The entry is in the schedule, so whichever replica owns the run when it
// is due resumes it, across restarts; a resume or a new pause meanwhile
// cancels it. A run that is not PAUSED gets INVALID_TRANSITION.
func (c *Controller) ResumeLater(ctx context.Context, runID string, at time.Time, req ResumeRequest) (*State, error) {
	if c.opts.Schedule == nil {
		return nil, errors.New("drain: no resume schedule")
	}
	snap, err := c.snapshot(ctx, runID)
	if err != nil {
		return nil, err
	}
	if snap.Status != statestore.RunStatusPaused || snap.Pause == nil {
		return nil, c.invalid(snap, statestore.RunResumed)
	}
	by := req.RequestedBy
	if by == "" {
		by = statestore.RequestedByBulk
	}
	e := ScheduledResume{RunID: runID, Cycle: snap.Pause.Cycle, At: at.UTC(), RequestedBy: by, Reason: req.Reason}
	if err := c.opts.Schedule.ScheduleResume(ctx, e); err != nil {
		return nil, err
	}
	if c.opts.Owner.Owns(runID) {
		// Queued here at once; another replica that owns the run reads
		// it from the schedule within IndexInterval.
		c.pacer.add(e)
	}
	return StateOf(snap, c.opts.DefaultTimeout), nil
}

// resumeLaterIfDue carries out a ResumeLater entry when it is due: the run
// is resumed if it is still paused in that cycle; the entry then goes. It
// reports false when the resume is to be tried again.
func (c *Controller) resumeLaterIfDue(ctx context.Context, snap *statestore.RunSnapshot, e ScheduledResume) bool {
	if c.opts.Now().Before(e.At) {
		return false
	}
	if snap.Status == statestore.RunStatusPaused && snap.Pause != nil && snap.Pause.Cycle == e.Cycle && !snap.CancelRequested {
		_, err := c.Resume(ctx, snap.RunID, ResumeRequest{RequestedBy: e.RequestedBy, Reason: e.Reason})
		var ee *EngineError
		switch {
		case err == nil, errors.As(err, &ee):
			c.opts.Metrics.scheduledResume()
		case errors.Is(err, statestore.ErrInvalidTransition):
			c.warns.Warn(c.logger, "staggered resume not possible: the run has a failed step held for an operator; dropped",
				zap.String("runId", snap.RunID), zap.Error(err))
		default:
			c.warns.Warn(c.logger, "staggered resume failed; retrying after the next read of the schedule", zap.String("runId", snap.RunID), zap.Error(err))
			return false
		}
	}
	_ = c.opts.Schedule.EndResume(ctx, snap.RunID, e.Cycle)
	return true
}
