/* SPDX-License-Identifier: MIT */
/*
 * report.h - what loadgen prints once the run is over: the summary on
 * stdout and, with -o, every request's record.
 */
#ifndef INFERGW_TOOLS_LOADGEN_REPORT_H
#define INFERGW_TOOLS_LOADGEN_REPORT_H

#include <stddef.h>
#include <stdint.h>

/*
 * The summary object on stdout, of run.recs over 'wall_us' (the rate's
 * time).  Returns the count of bad requests.
 */
size_t report_summary(int64_t wall_us);

/* -o FILE: every record as a JSON object, one a line.  0 or GW_EIO. */
int report_records(const char *path);

#endif
