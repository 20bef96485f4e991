package main

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
)

// Stat summarizes the samples of one side of a row.
type Stat struct {
	N      int     `json:"n"`
	Median float64 `json:"median"`
	P99    float64 `json:"p99"` // nearest rank; with N < 100 it is the maximum
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	Mean   float64 `json:"mean"`
	// Samples are the raw figures in run order, kept when there are at most
	// 50 of them.
	Samples []float64 `json:"samples,omitempty"`
}

// summarize returns the Stat of xs (which it does not modify).
func summarize(xs []float64) Stat {
	if len(xs) == 0 {
		return Stat{}
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	var sum float64
	for _, x := range s {
		sum += x
	}
	st := Stat{N: len(s), Median: quantile(s, 0.5), P99: nearestRank(s, 0.99), Min: s[0], Max: s[len(s)-1], Mean: sum / float64(len(s))}
	if len(xs) <= 50 {
		st.Samples = append([]float64(nil), xs...)
	}
	return st
}

// quantile of sorted s by linear interpolation (the median of an even count
// is the mean of the two middle values).
func quantile(s []float64, q float64) float64 {
	pos := q * float64(len(s)-1)
	lo := int(math.Floor(pos))
	hi := int(math.Ceil(pos))
	return s[lo] + (s[hi]-s[lo])*(pos-float64(lo))
}

// nearestRank is the q-quantile of sorted s by the nearest-rank method: the
// smallest sample with at least q of the samples at or below it.
func nearestRank(s []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(s)))) - 1
	if i < 0 {
		i = 0
	}
	return s[i]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// mbps is bytes per second in MB/s (10^6 bytes).
func mbps(bytes int64, d time.Duration) float64 { return float64(bytes) / 1e6 / d.Seconds() }

// Row is one line of the results table.
type Row struct {
	ID        string `json:"id"`        // "1", "7a", …
	Operation string `json:"operation"` // what is measured
	Ours      string `json:"ours"`      // what our side did
	Baseline  string `json:"baseline"`  // what the baseline did
	Unit      string `json:"unit"`      // "ms", "MB/s", "MiB"
	// Figure says which statistic the table shows: "median", "p50", "p99"
	// or "single" (one reading).
	Figure string `json:"figure"`
	// Better is "lower" or "higher".
	Better     string  `json:"better"`
	OursValue  float64 `json:"ours_value"`
	BaseValue  float64 `json:"baseline_value"`
	Ratio      float64 `json:"ratio"` // OursValue / BaseValue
	OursStat   *Stat   `json:"ours_stat,omitempty"`
	BaseStat   *Stat   `json:"baseline_stat,omitempty"`
	PeakRSSMiB float64 `json:"peak_rss_mib"`
	// RSSSource says whose peak RSS PeakRSSMiB is and how it was read.
	RSSSource string   `json:"rss_source"`
	Notes     []string `json:"notes,omitempty"`
	Error     string   `json:"error,omitempty"`
}

// pair builds a row from two sample sets, showing the median.
func pair(id, op, ours, base, unit, better string, o, b []float64) Row {
	so, sb := summarize(o), summarize(b)
	r := Row{ID: id, Operation: op, Ours: ours, Baseline: base, Unit: unit, Figure: "median", Better: better, OursValue: so.Median, BaseValue: sb.Median, OursStat: &so, BaseStat: &sb}
	r.Ratio = ratio(r.OursValue, r.BaseValue)
	return r
}

// latencyRows builds the p50 and p99 rows of a latency comparison.
func latencyRows(id, op, ours, base string, o, b []float64) []Row {
	so, sb := summarize(o), summarize(b)
	p50 := Row{ID: id + " p50", Operation: op + ", p50", Ours: ours, Baseline: base, Unit: "ms", Figure: "p50", Better: "lower", OursValue: so.Median, BaseValue: sb.Median, OursStat: &so, BaseStat: &sb}
	p99 := Row{ID: id + " p99", Operation: op + ", p99", Ours: ours, Baseline: base, Unit: "ms", Figure: "p99", Better: "lower", OursValue: so.P99, BaseValue: sb.P99}
	p50.Ratio = ratio(p50.OursValue, p50.BaseValue)
	p99.Ratio = ratio(p99.OursValue, p99.BaseValue)
	return []Row{p50, p99}
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// table renders rows as a Markdown table (readable as plain text too).
func table(rows []Row) string {
	var b strings.Builder
	b.WriteString("| # | operation | ours | Docker CLI / baseline | ratio | peak RSS (ours) |\n")
	b.WriteString("| --- | --- | ---: | ---: | ---: | ---: |\n")
	for _, r := range rows {
		if r.Error != "" {
			fmt.Fprintf(&b, "| %s | %s | FAILED: %s | | | |\n", r.ID, r.Operation, oneLine(r.Error))
			continue
		}
		base, rat := "—", "—"
		if r.BaseValue != 0 {
			base = fmt.Sprintf("%s %s", num(r.BaseValue), r.Unit)
			rat = fmt.Sprintf("%.2f×", r.Ratio)
		}
		rss := "—"
		if r.PeakRSSMiB > 0 {
			rss = fmt.Sprintf("%.1f MiB", r.PeakRSSMiB)
		}
		fmt.Fprintf(&b, "| %s | %s | %s %s | %s | %s | %s |\n", r.ID, r.Operation, num(r.OursValue), r.Unit, base, rat, rss)
	}
	return b.String()
}

// num prints a figure with three significant digits, at least.
func num(x float64) string {
	switch ax := math.Abs(x); {
	case ax >= 100:
		return fmt.Sprintf("%.0f", x)
	case ax >= 10:
		return fmt.Sprintf("%.1f", x)
	case ax >= 1:
		return fmt.Sprintf("%.2f", x)
	default:
		return fmt.Sprintf("%.3f", x)
	}
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	s = strings.ReplaceAll(s, "|", "/")
	if len(s) > 160 {
		s = s[:160] + "…"
	}
	return s
}
