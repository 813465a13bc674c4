// Package decide holds the operator's decisions as pure functions: a Service's whole plan
// (DecideService: which addresses to keep, claim and drain, and what the lb pods are built
// from), the choice and validation of its Subnet, the checks of its own fields, who is shown as
// the active holder (DecideActive), and the reasons of every condition and Event.
//
// Nothing here talks to the API server: the reconcilers in package controllers gather the
// inputs, call these functions, and carry the results out. TestPurePackages (controllers)
// fails if this package ever depends on controller-runtime or client-go.
package decide
