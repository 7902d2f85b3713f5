// Smoke program for the TypeScript client generated from docs/openapi.json with
// @hey-api/openapi-ts (docs/clients.md). Compiled with `tsc --strict`; uses only the
// generated code: no casts, no hand-parsed JSON.
// Env: ISTHMUS_URL, ISTHMUS_TOKEN (a user of team-a), ISTHMUS_ADMIN_TOKEN, ISTHMUS_SMOKE_ID.
import {
  cancelJob, createAccount, createLedgerAdjustment, deleteAccount, getAccount, getAccountUsage, getJob,
  getUsageReport, getUsageReportCsv, listAccountMembers, listAllAccounts, listBillingWeights, listJobEvents,
  listJobs, listLedgerEntries, readyz, removeAccountMember, setAccountMember, setAccountQuota, setBillingWeight,
  submitJob,
} from './gen';
import type { JobSpec, Problem } from './gen';
import { createClient, createConfig } from './gen/client';

function check(ok: boolean, message: string): asserts ok {
  if (!ok) {
    console.error(`FAIL: ${message}`);
    process.exit(1);
  }
}

/** The data of a successful call; the typed Problem of a failed one ends the program. */
function ok<T>(result: { data?: T; error?: Problem | unknown; response?: Response }): T {
  check(result.error === undefined && result.data !== undefined,
        `unexpected error ${result.response?.status}: ${JSON.stringify(result.error)}`);
  return result.data;
}

/** The typed Problem of a failed call, after checking its status and content type. */
function problem(result: { error?: Problem; response?: Response }, status: number): Problem {
  check(result.response?.status === status, `expected HTTP ${status}, got ${result.response?.status}`);
  check((result.response.headers.get('content-type') ?? '').startsWith('application/problem+json'),
        `error content type ${result.response.headers.get('content-type')}`);
  check(result.error !== undefined, 'no error body');
  check(result.error.status === status, `problem status ${result.error.status}`);
  return result.error;
}

async function main(): Promise<void> {
  const id = process.env.ISTHMUS_SMOKE_ID ?? 'x';
  const baseUrl = process.env.ISTHMUS_URL ?? '';
  const user = createClient(createConfig({ baseUrl, auth: process.env.ISTHMUS_TOKEN }));
  const admin = createClient(createConfig({ baseUrl, auth: process.env.ISTHMUS_ADMIN_TOKEN }));

  const ready = ok(await readyz({ client: user }));
  check(ready.status === 'ok', `readyz ${ready.status}`);

  // --- jobs: submit with an Idempotency-Key, replay it
  const spec: JobSpec = {
    name: `ts-smoke-${id}`, account: 'team-a', command: ['python', 'train.py'],
    workers: 2, gpus_per_worker: 4, memory_per_worker: 8192, time_limit: '90m',
  };
  const key = `ts-smoke-key-${id}`;
  const first = await submitJob({ client: user, body: spec, headers: { 'Idempotency-Key': key } });
  const job = ok(first);
  check(first.response.status === 202, `submit status ${first.response.status}`);
  check(job.state === 'pending' && job.total_gpus === 8, `submitted ${JSON.stringify(job)}`);
  check(job.memory_per_worker === '8Gi' && job.time_limit === '01:30:00', 'normalised spec');
  check(job.assigned_backend === null, 'pending job already routed');
  const replay = await submitJob({ client: user, body: spec, headers: { 'Idempotency-Key': key } });
  check(replay.response.status === 200 && ok(replay).id === job.id, 'replay is not the same job');

  // --- list (filtering with values read from a response), get, events, cancel
  const page = ok(await listJobs({ client: user, query: { state: [job.state], backend: job.backend, limit: 50 } }));
  check(page.items.some((j) => j.id === job.id), 'submitted job not listed');
  const got = ok(await getJob({ client: user, path: { job_id: job.id } }));
  check(got.name === spec.name && got.created_at === job.created_at, 'getJob');
  const cancelled = ok(await cancelJob({ client: user, path: { job_id: job.id } }));
  check(cancelled.state === 'cancelled', `cancel: ${cancelled.state}`);
  check(cancelled.ended_at != null && cancelled.exit_code == null, `cancelled pending job: ended_at ${cancelled.ended_at}, exit_code ${cancelled.exit_code}`);
  const events = ok(await listJobEvents({ client: user, path: { job_id: job.id }, query: { after: 0 } }));
  const states = events.items.map((e) => e.to_state).filter((s) => s !== null);
  check(states.join(',') === 'pending,cancelled', `events ${states}`);
  const last = events.items[events.items.length - 1];
  check(last !== undefined, 'no events');
  const more = ok(await listJobEvents({ client: user, path: { job_id: job.id }, query: { after: last.id } }));
  check(more.items.length === 0, 'events after the last one');

  // --- validation errors, read as Problem
  const bad = problem(await submitJob({ client: user, body: { ...spec, workers: 0 } }), 422);
  check(bad.title === 'Invalid request' && bad.detail.includes('body.workers'), `problem ${bad.title}: ${bad.detail}`);
  check(bad.errors?.[0]?.field === 'body.workers', `problem errors ${JSON.stringify(bad.errors)}`);
  const badName = problem(await getAccount({ client: admin, path: { name: 'Not_An_Account' } }), 422);
  check(badName.errors?.[0]?.field === 'path.name', 'getAccount 422 field');
  const hidden = problem(await getAccountUsage({ client: user, path: { name: 'team-b' } }), 404);
  check(hidden.detail.length > 0, '404 without detail');

  // --- admin: an account whose budget needs full double precision
  const name = `ts-smoke-${id}`;
  const acc = ok(await createAccount({ client: admin, body: {
    name, quota: { budget_gpu_hours: 1234567.89, budget_period: 'month' } } }));
  check(acc.quota.budget_gpu_hours.value === 1234567.89, `budget ${acc.quota.budget_gpu_hours.value}`);
  const acc2 = ok(await setAccountQuota({ client: admin, path: { name }, body: {
    max_gpus: 500_000, budget_period: acc.quota.budget_period } }));
  check(acc2.quota.max_gpus.value === 500_000, `max_gpus ${acc2.quota.max_gpus.value}`);
  check(ok(await listAllAccounts({ client: admin })).length >= 3, 'listAllAccounts');

  // members: a role read back is passed back
  const alice = ok(await setAccountMember({ client: admin, path: { name, username: 'alice' }, body: { role: 'coordinator' } }));
  ok(await setAccountMember({ client: admin, path: { name, username: 'bob' }, body: { role: alice.role } }));
  const members = ok(await listAccountMembers({ client: admin, path: { name } }));
  check(members.length === 2 && members.every((m) => m.role === 'coordinator'), 'members');
  const removed = await removeAccountMember({ client: admin, path: { name, username: 'bob' } });
  check(removed.response.status === 204 && removed.error === undefined, 'removeAccountMember');

  // billing weights: a pool read back is passed back
  const gpuType = `ts-smoke-${id}`;
  ok(await setBillingWeight({ client: admin, path: { pool: 'kubernetes', gpu_type: gpuType }, body: { weight: 2 } }));
  const mine = ok(await listBillingWeights({ client: admin })).find((w) => w.gpu_type === gpuType);
  check(mine !== undefined && mine.pool === 'kubernetes', 'billing weight not listed');
  const w = ok(await setBillingWeight({ client: admin, path: { pool: mine.pool, gpu_type: mine.gpu_type }, body: { weight: 1.5 } }));
  check(w.pool === mine.pool && w.weight === 1.5, 'setBillingWeight');

  // --- a large credit: 1,000,000 GPU-hours is -3.6e9 GPU-seconds (beyond 32 bits)
  const entry = ok(await createLedgerAdjustment({ client: admin, body: {
    account: name, kind: 'credit', gpu_hours: 1_000_000, reason: `ts smoke ${id}` } }));
  check(entry.gpu_seconds === -3_600_000_000 && entry.kind === 'credit', `credit ${JSON.stringify(entry)}`);
  const ledger = ok(await listLedgerEntries({ client: admin, query: { account: name, kind: [entry.kind] } }));
  check(ledger.items.length === 1 && ledger.items[0]?.id === entry.id, 'ledger');
  ok(await listLedgerEntries({ client: admin, query: { limit: 1000 } }));

  // --- usage as JSON and CSV
  const report = ok(await getUsageReport({ client: admin, query: { account: name } }));
  const row = report.items[0];
  check(report.items.length === 1 && row !== undefined && row.adjustment_gpu_seconds === -3_600_000_000 &&
        row.net_gpu_hours === -1_000_000 && row.pool === null, `usage ${JSON.stringify(report.items)}`);
  const csv = ok(await getUsageReportCsv({ client: admin, query: { account: name, period: report.period } }));
  check(csv.startsWith('account,pool,period,') && csv.includes(`${name},,`) && csv.includes(',-3600000000,'),
        `csv ${JSON.stringify(csv)}`);
  const usage = ok(await getAccountUsage({ client: admin, path: { name } }));
  check(usage.account === name, 'getAccountUsage');

  // --- delete; then the account is gone (a Problem again)
  const deleted = await deleteAccount({ client: admin, path: { name } });
  check(deleted.response.status === 204 && deleted.error === undefined, 'deleteAccount');
  problem(await getAccount({ client: admin, path: { name } }), 404);
  console.log('ts smoke: ok');
}

main().catch((err: unknown) => {
  console.error('FAIL:', err);
  process.exit(1);
});
