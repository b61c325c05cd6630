/** Public surface of the router package (services reach it over HTTP, not by import). */
export type { RouterDeps } from './app.ts';
export { buildApp, createRouterDeps } from './app.ts';
export type { RouterConfig } from './config.ts';
export { loadRouterConfig, routerSettings } from './config.ts';
export type { RunningRouter } from './service.ts';
export { startRouter } from './service.ts';
