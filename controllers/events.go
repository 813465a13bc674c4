package controllers

// Event actions (the events.k8s.io "action" field): what the operator was doing.
const (
	actionAllocate = "Allocate"
	actionApply    = "Apply"
	actionCleanup  = "Cleanup"
	actionResolve  = "Resolve"
	actionValidate = "Validate"
	actionDelete   = "Delete"
	actionRelease  = "Release"
	actionSchedule = "Schedule"
	actionProbe    = "Probe"
)
