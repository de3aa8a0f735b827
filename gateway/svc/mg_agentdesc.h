/*
 * mg_agentdesc: agent descriptors (moongate.v1.AgentDescriptor), the blob ExportAgent gives
 * and ImportAgent takes, decoded and checked before anything trusts a field of it.
 */
#ifndef MG_AGENTDESC_H
#define MG_AGENTDESC_H

#include "moongate/v1/agent.pb-c.h"

#include <stddef.h>
#include <stdint.h>

#define MG_AGENTDESC_VERSION 1
#define MG_AGENTDESC_MAX     (128 * 1024) /* bytes a descriptor may have */

/* Decodes and checks a descriptor: its size, strings (no NUL, UTF-8), version 1 and no field
 * version 1 does not have (the message is repacked and kept nowhere else), an endpoint
 * "host:port", a valid tenant and agent name, a port 1..65535, epoch and agent_id set, at most
 * 1024 regions, each non-empty, not wrapping, in address order without overlap. Returns the
 * message (moongate__v1__agent_descriptor__free_unpacked) or NULL with why set. */
Moongate__V1__AgentDescriptor *mg_agentdesc_decode(const uint8_t *buf, size_t len, char *why,
                                                   size_t cap);

/* The agent as its daemon has it now (name, port, agent_id) and that daemon's epoch, against
 * the descriptor d: 0 when they are the one it names, or MG_ERR_STATE with why naming every
 * field that differs and both values (another epoch: its daemon restarted; another agent_id or
 * port: registered again, or forged). */
int mg_agentdesc_compare(const Moongate__V1__AgentDescriptor *d, const char *name, uint32_t port,
                         uint64_t epoch, uint64_t agent_id, char *why, size_t cap);

#endif
