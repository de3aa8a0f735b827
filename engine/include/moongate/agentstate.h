/*
 * moongate agent state: the text of the file a daemon keeps of its agents
 * (<shm-dir>/.moongate.agents), so that the daemon started after it holds their ports for them
 * (moongate/agents.h, --agent-port-hold).
 *
 * Version 1, one line each, every line ending in '\n':
 *
 *   moongate-agents 1
 *   agent TENANT NAME PORT
 *
 * TENANT and NAME are 1..128 of [A-Za-z0-9._:-], PORT 1..65535 in decimal (no leading zero),
 * one space between the words: a file read is byte for byte what mg_agentstate_format writes
 * of its entries. Nothing else is read: another version, a line of another shape, a file cut short
 * (its last line without '\n') or one of more entries than the reader takes is refused whole,
 * naming the line. Pure functions of their arguments: any thread.
 */
#ifndef MOONGATE_AGENTSTATE_H
#define MOONGATE_AGENTSTATE_H

#include <stddef.h>

#include "moongate/agents.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MG_AGENTSTATE_FILE    ".moongate.agents" /* in the shm directory */
#define MG_AGENTSTATE_VERSION 1
/* The longest line: "agent " TENANT " " NAME " " PORT "\n". */
#define MG_AGENTSTATE_LINE_MAX (6 + MG_SEG_NAME_MAX + 1 + MG_AGENT_NAME_MAX + 1 + 5 + 1)

/* The file's text for entries v[0..n): malloc'd into *out, *len bytes (no NUL after them).
 * Returns 0, or MG_ERR_NOMEM. Entries are written as they are (the table made them valid). */
int mg_agentstate_format(const mg_agent_entry *v, size_t n, char **out, size_t *len);

/* Reads text (len bytes, any bytes) into out (room for max entries). Returns 0 with *n
 * entries, or MG_ERR_INVALID with why (cap bytes) and *line (1-based) naming the line that is
 * wrong. Entries are checked one by one (tenant, name, port); whether two of them clash is the
 * table's to say (mg_agents_hold). */
int mg_agentstate_parse(const char *text, size_t len, mg_agent_entry *out, size_t max, size_t *n,
                        size_t *line, char *why, size_t cap);

#ifdef __cplusplus
}
#endif

#endif
