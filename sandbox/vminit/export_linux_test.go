//go:build linux

package vminit

// Internals the external tests use to look at processes.
type ProcStat = procStat

var (
	Processes      = processes
	ReadProcStat   = readProcStat
	ParseProcStat  = parseProcStat
	SameProcessFor = sameProcess
)
