// Package lbobjects builds the per-Service objects from plain parameters (Params): the lb pods'
// Deployment, their ServiceAccount, Role and RoleBinding, and with standbys their Lease and
// PodDisruptionBudget (Set, Build); their names and labels; and the comparisons that tell whether
// a live object still is what was built (UpToDate, SamePodShape, the spec digests of the trimmed
// cache).
//
// It is pure: the reconcilers write what it builds. TestPurePackages (controllers) fails if this
// package ever depends on controller-runtime or client-go.
package lbobjects
